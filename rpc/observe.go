package rpc

import "time"

// Outcome is how a check was answered, for metrics.
type Outcome uint8

// The outcomes of a check.
const (
	// OutcomeAllowed: the hits were admitted and counted.
	OutcomeAllowed Outcome = iota
	// OutcomeDenied: over the limit; nothing was counted.
	OutcomeDenied
	// OutcomeShadowDenied: over a limit in shadow mode; answered allowed.
	OutcomeShadowDenied
	// OutcomeError: not decided (e.g. the owner could not be reached).
	OutcomeError
	// OutcomeInvalid: refused as bad input, with the rest of its batch;
	// nothing was counted.
	OutcomeInvalid

	numOutcomes = iota
)

// String returns the outcome's metric label: "allowed", "denied",
// "shadow_denied", "error" or "invalid".
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeDenied:
		return "denied"
	case OutcomeShadowDenied:
		return "shadow_denied"
	case OutcomeInvalid:
		return "invalid"
	default:
		return "error"
	}
}

// InlineName is the name [Observer.Checked] gets for a check whose name is
// not a configured limit: names chosen by clients are not metric labels,
// so that they cannot grow the metrics without bound.
const InlineName = "(inline)"

// Observer is told of a Server's events, for metrics. Its methods are
// called on the request path: they must be cheap, never block, and be safe
// for concurrent use.
type Observer interface {
	// Checked is called once for every check that Check answered (on the
	// node the client called): name is the check's limit name if it is a
	// configured limit, else [InlineName]. The checks of a batch refused
	// as bad input are each reported as [OutcomeInvalid] under InlineName.
	Checked(name string, outcome Outcome)
	// Forwarded is called once for every call that carried forwarded
	// checks to peer (a member name): how many checks, how long the call
	// took, and its error (nil on success).
	Forwarded(peer string, checks int, took time.Duration, err error)
}
