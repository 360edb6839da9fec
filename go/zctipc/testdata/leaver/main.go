// Command leaver is a Go program that uses zctipc and ends without closing
// anything: it makes a tensor, a queue holding a tensor, and a stream,
// prints their names, and then returns from main once its standard input
// ends ("return") or waits to be killed ("wait"). What it held must not
// outlive it.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/zctipc/zctipc/go/zctipc"
)

func main() {
	t, err := zctipc.NewTensor("", zctipc.Float32, 1024)
	check(err)
	q, err := zctipc.NewQueue("", 1<<16)
	check(err)
	sent, err := zctipc.NewTensor("", zctipc.Int64, 16)
	check(err)
	check(q.PutTensor(context.Background(), sent))
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{64}, Frames: 4, Readers: 1})
	check(err)
	fmt.Println(t.Name(), q.Name(), sent.Name(), s.Name())
	if len(os.Args) > 1 && os.Args[1] == "wait" {
		select {}
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "leaver:", err)
		os.Exit(1)
	}
}
