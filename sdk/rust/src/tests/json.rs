//! A minimal JSON reader for the test vectors (the SDK has no dependencies).

use std::collections::BTreeMap;

/// A JSON value; numbers are kept as f64, which holds every u32 exactly.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    /// Parses a whole document; it panics on malformed input (a broken vector).
    pub fn parse(text: &str) -> Json {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.s.len(), "trailing data after the JSON value");
        v
    }

    /// Returns the member `key` of an object; it panics when there is none.
    pub fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(key).unwrap_or_else(|| panic!("no member {key:?}")),
            _ => panic!("{self:?} is not an object"),
        }
    }

    pub fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("{self:?} is not a string"),
        }
    }

    pub fn u64(&self) -> u64 {
        match self {
            Json::Num(n) if n.fract() == 0.0 && *n >= 0.0 => *n as u64,
            _ => panic!("{self:?} is not an unsigned integer"),
        }
    }

    pub fn bool(&self) -> bool {
        match self {
            Json::Bool(b) => *b,
            _ => panic!("{self:?} is not a boolean"),
        }
    }

    pub fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            _ => panic!("{self:?} is not an array"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(
            self.s.get(self.i),
            Some(&c),
            "want {:?} at byte {}",
            c as char,
            self.i
        );
        self.i += 1;
    }

    fn literal(&mut self, word: &str, v: Json) -> Json {
        assert!(
            self.s[self.i..].starts_with(word.as_bytes()),
            "bad literal at byte {}",
            self.i
        );
        self.i += word.len();
        v
    }

    fn value(&mut self) -> Json {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => Json::Str(self.string()),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            _ => self.number(),
        }
    }

    fn object(&mut self) -> Json {
        self.eat(b'{');
        let mut m = BTreeMap::new();
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Json::Obj(m);
        }
        loop {
            self.ws();
            let k = self.string();
            self.eat(b':');
            m.insert(k, self.value());
            self.ws();
            self.i += 1;
            match self.s[self.i - 1] {
                b',' => continue,
                b'}' => return Json::Obj(m),
                c => panic!("want , or }} at byte {}, got {:?}", self.i - 1, c as char),
            }
        }
    }

    fn array(&mut self) -> Json {
        self.eat(b'[');
        let mut a = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b']') {
            self.i += 1;
            return Json::Arr(a);
        }
        loop {
            a.push(self.value());
            self.ws();
            self.i += 1;
            match self.s[self.i - 1] {
                b',' => continue,
                b']' => return Json::Arr(a),
                c => panic!("want , or ] at byte {}, got {:?}", self.i - 1, c as char),
            }
        }
    }

    fn number(&mut self) -> Json {
        let start = self.i;
        while self.i < self.s.len() && b"+-0123456789.eE".contains(&self.s[self.i]) {
            self.i += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
        Json::Num(
            text.parse()
                .unwrap_or_else(|_| panic!("bad number {text:?} at byte {start}")),
        )
    }

    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out: Vec<u8> = Vec::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).expect("a JSON string is UTF-8"),
                b'\\' => self.escape(&mut out),
                _ => out.push(c),
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) {
        let c = self.s[self.i];
        self.i += 1;
        let ch = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => self.unicode(),
            _ => panic!("bad escape \\{} at byte {}", c as char, self.i),
        };
        let mut tmp = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
    }

    fn hex4(&mut self) -> u32 {
        let text = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
        self.i += 4;
        u32::from_str_radix(text, 16).unwrap()
    }

    fn unicode(&mut self) -> char {
        let hi = self.hex4();
        if (0xd800..0xdc00).contains(&hi) {
            assert_eq!(&self.s[self.i..self.i + 2], b"\\u", "lone high surrogate");
            self.i += 2;
            let lo = self.hex4();
            return char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)).unwrap();
        }
        char::from_u32(hi).expect("a lone surrogate")
    }
}
