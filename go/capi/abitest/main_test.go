// Package abitest tests zctipc across the C ABI: libzctipc.so built as
// setup.py builds it, its exports against the hand-written zctipc.h, and C
// programs (testdata/*.c) that use it. The Go packages' own tests sit
// beside them; these need none of them, only the library and the variables
// documented in the README.
//
// Every test builds the library and C programs, which takes seconds:
// under -short (make gounit) they skip, and make gotest runs them.
package abitest

import (
	"testing"

	"github.com/zctipc/zctipc/go/internal/testenv"
)

// TestMain runs the tests with a segment directory of their own, which must
// be empty when they end (testenv.Main). The C programs keep no ledger
// (cleanup is off): cleanup is tested elsewhere.
func TestMain(m *testing.M) { testenv.Main(m) }
