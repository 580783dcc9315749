package plan

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The fields of Service that SameRules ignores, by path: what cannot change
// a rule. Every other field must make SameRules false when it changes.
var notRules = []string{"Labels", "Annotations", "Endpoints[0].Pod"}

// The fields Clone shares with its original instead of copying: documented
// as never modified in place.
var sharedByClone = []string{"Labels", "Annotations"}

// TestServiceMethodsCoverEveryField changes each field of a fully set
// Service, one at a time and down to the fields of its Key, Affinity and
// Endpoints, found by reflection: a field added to the plan but forgotten
// in Equal, SameRules or Clone fails here instead of never being synced.
func TestServiceMethodsCoverEveryField(t *testing.T) {
	base := fullService()
	if c := base.Clone(); !reflect.DeepEqual(c, base) {
		t.Fatalf("Clone differs from its original:\n%+v\n%+v", c, base)
	}
	paths := fieldPaths(reflect.TypeFor[Service](), "")
	if len(paths) < 25 { // a sanity check of fieldPaths itself
		t.Fatalf("found only %d fields: %v", len(paths), paths)
	}
	// A pointer field that is unset is a change too.
	for i := range reflect.TypeFor[Service]().NumField() {
		if f := reflect.ValueOf(base.Clone()).Elem().Field(i); f.Kind() == reflect.Pointer {
			unset := base.Clone()
			reflect.ValueOf(unset).Elem().Field(i).SetZero()
			if unset.Equal(base) || unset.SameRules(base) {
				t.Errorf("Equal or SameRules misses %s set to nil", reflect.TypeFor[Service]().Field(i).Name)
			}
		}
	}
	for _, path := range paths {
		changed := base.Clone()
		change(t, reflect.ValueOf(changed).Elem(), path)
		if changed.Equal(base) {
			t.Errorf("Equal misses a change of %s", path)
		}
		if same := changed.SameRules(base); same != slices.Contains(notRules, path) {
			t.Errorf("a change of %s: SameRules = %v, want %v", path, same, !same)
		}
		if slices.Contains(sharedByClone, path) {
			continue
		}
		// Changing a clone in place leaves the original as it was (and as
		// fullService builds it anew: a clone may share nothing to change).
		changeInPlace(t, reflect.ValueOf(base.Clone()).Elem(), path)
		if !reflect.DeepEqual(base, fullService()) {
			t.Errorf("changing %s in a clone changed the original", path)
			base = fullService()
		}
	}
}

// TestNodeAndPlanCloneAreDeep changes each field of a cloned Node and Plan
// in place and checks that the originals keep their values.
func TestNodeAndPlanCloneAreDeep(t *testing.T) {
	p := sample()
	for _, path := range fieldPaths(reflect.TypeFor[Node](), "Node.") {
		changeInPlace(t, reflect.ValueOf(p.Clone()).Elem(), path)
		if !reflect.DeepEqual(sample(), p) {
			t.Errorf("changing %s in a clone of the plan changed the original", path)
		}
	}
	c := p.Clone()
	c.ServiceCIDRs[0] = netip.MustParsePrefix("0.0.0.0/0")
	for _, s := range c.Services {
		s.Port++
	}
	if !reflect.DeepEqual(sample(), p) {
		t.Error("changing a clone's service CIDRs or services changed the original")
	}
}

// fullService returns a service with every field set, two endpoints and
// non-nil maps, so that each field has a value to change.
func fullService() *Service {
	s := &Service{}
	fill(reflect.ValueOf(s).Elem())
	return s
}

// fill sets every field of v, recursively, to a non-zero value.
func fill(v reflect.Value) {
	switch v.Type() {
	case reflect.TypeFor[netip.Addr]():
		v.Set(reflect.ValueOf(netip.MustParseAddr("10.0.0.1")))
		return
	case reflect.TypeFor[netip.Prefix]():
		v.Set(reflect.ValueOf(netip.MustParsePrefix("10.0.0.0/8")))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(v.Index(i))
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(reflect.ValueOf("k"), reflect.ValueOf("v"))
	default:
		set(v)
	}
}

// fieldPaths lists the leaf fields of t as dotted paths ("Affinity.TimeoutSeconds",
// "Endpoints[0].Pod"); netip values, maps and slices of non-structs are leaves.
func fieldPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		path := prefix + f.Name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && !isNetip(ft):
			out = append(out, fieldPaths(ft, path+".")...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && !isNetip(ft.Elem()):
			out = append(out, fieldPaths(ft.Elem(), path+"[0].")...)
		default:
			out = append(out, path)
		}
	}
	return out
}

func isNetip(t reflect.Type) bool { return t.PkgPath() == "net/netip" }

// change gives the field at path a different value, replacing slices and
// maps rather than writing into them.
func change(t *testing.T, v reflect.Value, path string) {
	f := walk(t, v, path, true)
	switch f.Kind() {
	case reflect.Slice:
		n := reflect.MakeSlice(f.Type(), f.Len(), f.Len())
		reflect.Copy(n, f)
		set(n.Index(0))
		f.Set(n)
	case reflect.Map:
		n := reflect.MakeMap(f.Type())
		n.SetMapIndex(reflect.ValueOf("other"), reflect.ValueOf("v"))
		f.Set(n)
	default:
		set(f)
	}
}

// changeInPlace writes a different value into the field at path, inside
// the slice or pointer that holds it, as a careless caller would.
func changeInPlace(t *testing.T, v reflect.Value, path string) {
	f := walk(t, v, path, false)
	if f.Kind() == reflect.Slice {
		f = f.Index(0)
	}
	set(f)
}

// walk follows path from v; copyOnWrite replaces the pointers and slices on
// the way by copies first, so the change stays in v.
func walk(t *testing.T, v reflect.Value, path string, copyOnWrite bool) reflect.Value {
	for part := range strings.SplitSeq(path, ".") {
		name, indexed := strings.CutSuffix(part, "[0]")
		v = v.FieldByName(name)
		if !v.IsValid() {
			t.Fatalf("no field %s in path %s", name, path)
		}
		if v.Kind() == reflect.Pointer {
			if copyOnWrite {
				p := reflect.New(v.Type().Elem())
				p.Elem().Set(v.Elem())
				v.Set(p)
			}
			v = v.Elem()
		}
		if indexed {
			if copyOnWrite {
				n := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
				reflect.Copy(n, v)
				v.Set(n)
			}
			v = v.Index(0)
		}
	}
	return v
}

// set gives a scalar or netip value a different, non-zero value.
func set(v reflect.Value) {
	switch v.Type() {
	case reflect.TypeFor[netip.Addr]():
		a := v.Interface().(netip.Addr)
		v.Set(reflect.ValueOf(a.Next()))
		return
	case reflect.TypeFor[netip.Prefix]():
		p := v.Interface().(netip.Prefix)
		v.Set(reflect.ValueOf(netip.PrefixFrom(p.Addr(), p.Bits()+1)))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		v.SetUint(v.Uint() + 1)
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		v.SetInt(v.Int() + 1)
	default:
		panic("set: no different value for a " + v.Type().String() + "; teach this test the new field's type")
	}
}
