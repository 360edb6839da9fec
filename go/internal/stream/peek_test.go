package stream_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/stream"
)

// TestStreamPeekNeverShowsATornFrame copies frames of a stream without
// readers whose writer takes every slot again at once: each frame holds its
// position in every word, so a torn copy or another frame's shows.
func TestStreamPeekNeverShowsATornFrame(t *testing.T) {
	for _, policy := range []stream.Policy{stream.Block, stream.Overwrite} {
		t.Run(policy.String(), func(t *testing.T) {
			cfg := frameConfig(3, 1, policy)
			cfg.Shape = []int64{8192}
			s := mustStream(t, cfg)
			w := mustWriter(t, s)
			const total = 50000
			go publishThenEnd(t, s, w, total)
			buf := make([]byte, s.FrameBytes())
			pos, seen := stream.PeekLatest, 0
			for {
				got, err := s.Peek(pos, buf)
				if errors.Is(err, stream.ErrEnded) {
					break
				}
				pos = got
				if errors.Is(err, stream.ErrEmpty) {
					continue
				}
				require.NoError(t, err)
				for i := 0; i < len(buf); i += 8 {
					require.Equal(t, got, binary.LittleEndian.Uint64(buf[i:]), "frame %d whole", got)
				}
				seen++
				pos = got + 1
			}
			require.Positive(t, seen)
			t.Logf("peeked %d of %d frames", seen, total)
		})
	}
}
