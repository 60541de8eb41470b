package committedkeys

// Contains reports whether h was added less than the ttl ago and not
// evicted since.
func (c *Cache) Contains(h Hash) bool {
	hit, _ := c.Lookup(h)
	return hit
}

// Len is the number of live and expired entries not yet dropped, for
// tests and measurements.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
