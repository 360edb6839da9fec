package handover_test

import (
	"testing"

	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// TestMain runs the tests with a segment directory of their own, which must
// be empty when they end, or runs a helper process of theirs (testenv.Main).
func TestMain(m *testing.M) { testenv.Main(m, pool.CloseTickets) }
