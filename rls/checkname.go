package rls

// CheckName returns the limit name sluice checks the rule's descriptors
// under: the rule's place in its domain's tree of descriptors, or, when
// that is longer than a limit name may be, "rls#" and its hex SHA-256. An
// operator gives it (with the descriptors' values as the key) to inspect
// or reset one of the rule's keys (docs/admin.md).
func (r *Rule) CheckName() string { return r.checkName }
