package replica

import "time"

// Defaults for Config.
const (
	DefaultFactor   = 1
	DefaultInterval = 100 * time.Millisecond
)

// Config shapes the copies each owner keeps of its keys on the next
// members of the ring.
type Config struct {
	// Factor is the number of extra copies of each key, on the members
	// that follow its owner on the ring. Default 1; negative turns
	// replication off (Disabled). (Optional)
	Factor int
	// Disabled turns replication off (same as a negative Factor).
	// (Optional)
	Disabled bool
	// Interval is how often an owner sends the keys that changed since
	// the last send. A crashed owner loses at most the hits it admitted
	// in the last Interval plus the duration of one send (bounded by the
	// forward timeout). Default 100 ms. (Optional)
	Interval time.Duration
}

// WithDefaults returns c with its defaults filled in: Factor 0 when
// replication is off (Disabled or a negative Factor), else at least 1.
func (c Config) WithDefaults() Config {
	if c.Factor < 0 {
		c.Disabled = true
	}
	if c.Factor == 0 {
		c.Factor = DefaultFactor
	}
	if c.Disabled {
		c.Factor = 0
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	return c
}
