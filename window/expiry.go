package window

import "time"

// Expires returns the time at which the key whose state s is would be back
// at full capacity if nothing hit it; from then on s changes no decision
// and may be dropped. A zero State expires at the Unix epoch.
func (s State) Expires() time.Time { return time.Unix(0, s.st.expires()) }
