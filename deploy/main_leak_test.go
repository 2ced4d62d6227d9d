package deploy

import (
	"testing"

	"github.com/sluicehq/sluice/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
