package nftables

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// ruleBytes encodes a rule's expressions the way the kernel lists them, so
// a rule Weir builds and the same rule read back compare equal: the kernel
// names a register holding 128 bits by its 128-bit number (NFT_REG32_00
// comes back as NFT_REG_1), and a NAT range it was given one end of by both
// ends. The netlink library drops byteorder expressions when it reads a
// rule, so they are left out here too. Nil when an expression cannot be
// encoded.
func ruleBytes(fam nftables.TableFamily, exprs []expr.Any) []byte {
	var out []byte
	for _, e := range exprs {
		if _, ok := e.(*expr.Byteorder); ok {
			continue
		}
		b, err := expr.Marshal(byte(fam), normalized(e))
		if err != nil {
			return nil
		}
		out = append(out, b...)
	}
	return out
}

// registerFields are the fields of the expr types that name a register.
var registerFields = map[string]bool{"Register": true, "SourceRegister": true, "DestRegister": true,
	"SrcRegKey": true, "SrcRegData": true, "RegAddrMin": true, "RegAddrMax": true, "RegProtoMin": true, "RegProtoMax": true}

// normalized returns a copy of e with its registers and NAT range in the
// kernel's form.
func normalized(e expr.Any) expr.Any {
	v := reflect.ValueOf(e)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return e
	}
	c := reflect.New(v.Elem().Type())
	c.Elem().Set(v.Elem())
	s := c.Elem()
	for i := range s.NumField() {
		if f := s.Field(i); f.Kind() == reflect.Uint32 && registerFields[s.Type().Field(i).Name] {
			f.SetUint(uint64(kernelRegister(uint32(f.Uint()))))
		}
	}
	out := c.Interface().(expr.Any)
	if nat, ok := out.(*expr.NAT); ok {
		if nat.RegAddrMax == 0 {
			nat.RegAddrMax = nat.RegAddrMin
		}
		if nat.RegProtoMax == 0 {
			nat.RegProtoMax = nat.RegProtoMin
		}
	}
	return out
}

// kernelRegister is the number the kernel lists register r by.
func kernelRegister(r uint32) uint32 {
	const reg32First, reg32Last = 8, 23 // NFT_REG32_00, NFT_REG32_15
	if r >= reg32First && r <= reg32Last && (r-reg32First)%4 == 0 {
		return (r-reg32First)/4 + 1
	}
	return r
}

// readsSet reports whether a rule looks a packet up in set (or updates it).
func readsSet(exprs []expr.Any, set string) bool {
	for _, e := range exprs {
		switch x := e.(type) {
		case *expr.Lookup:
			if x.SetName == set {
				return true
			}
		case *expr.Dynset:
			if x.SetName == set {
				return true
			}
		}
	}
	return false
}

// summarize describes a rule Weir did not write in a few words: its
// expressions' kinds, the sets it reads and its verdicts.
func summarize(exprs []expr.Any) string {
	parts := make([]string, 0, len(exprs))
	for _, e := range exprs {
		switch x := e.(type) {
		case *expr.Lookup:
			parts = append(parts, "lookup @"+x.SetName)
		case *expr.Dynset:
			parts = append(parts, "update @"+x.SetName)
		case *expr.Verdict:
			parts = append(parts, verdictText(x))
		default:
			parts = append(parts, strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr.")))
		}
	}
	if len(parts) == 0 {
		return "(empty)"
	}
	return strings.Join(parts, ", ")
}

func verdictText(v *expr.Verdict) string {
	names := map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop",
		expr.VerdictReturn: "return", expr.VerdictJump: "jump", expr.VerdictGoto: "goto", expr.VerdictContinue: "continue"}
	text, ok := names[v.Kind]
	if !ok {
		text = fmt.Sprintf("verdict %d", v.Kind)
	}
	if v.Chain != "" {
		text += " " + v.Chain
	}
	return text
}
