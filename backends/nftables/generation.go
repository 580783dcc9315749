package nftables

// The ruleset generation. nf_tables numbers the committed transactions of a
// network namespace, anyone's, in one counter. Weir keeps the generation
// its own commit produced when nothing else committed around it (the
// counter moved by exactly one). A periodic full sync that finds the
// counter still there knows that no table changed since, Weir's or any
// other (packets refreshing affinity entries commit nothing), so it only
// writes what the plan changed, which is usually nothing; any other commit
// makes it refill every object, which repairs whatever was done. Without
// the stamp a periodic sync rewrote everything, every sticky chain's rules
// included, each syncPeriod.

// genStamp is the generation after Weir's last commit, when trusted.
type genStamp struct {
	value uint32
	valid bool
}

// generation returns the namespace's ruleset generation. When it cannot
// be read, the stamp is no longer trusted.
func (b *Backend) generation() (uint32, error) {
	g, err := b.kernel.generation()
	if err != nil {
		b.gen.valid = false
	}
	return g, err
}

// untouched reports whether the ruleset is as Weir's last commit left it.
func (b *Backend) untouched() bool {
	if !b.gen.valid {
		return false
	}
	g, err := b.generation()
	return err == nil && g == b.gen.value
}

// restamp records the generation after a commit that began at before
// (beforeOK when it could be read). It is trusted when the counter moved by
// one, so the commit in between was Weir's alone, and the kernel held what
// Weir knows before it: after a full sync, which wrote every object, or
// when the generation before was the trusted one. A partial sync after
// someone else's change leaves it untrusted, so the next full sync refills.
func (b *Backend) restamp(before uint32, beforeOK, full bool) {
	after, err := b.generation()
	known := full || (b.gen.valid && before == b.gen.value)
	b.gen.value = after
	b.gen.valid = beforeOK && err == nil && after == before+1 && known
}
