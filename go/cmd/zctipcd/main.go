// Command zctipcd is the per-user cleanup daemon of zctipc (package daemon).
// Clients start it on demand; it exits after a while with nothing to watch.
//
//	zctipcd [-dir DIR] [-shm-dir DIR] [-idle 10s] [-silent 30s] [-detach]
//
// With -detach it starts itself again in a new session, with its output in
// the runtime directory's daemon.log, and exits at once. It exits with
// status 0 when another daemon already serves the directory. (A Go program
// that links package zctipc is its own daemon and needs no zctipcd.)
package main

import (
	"os"

	"github.com/zctipc/zctipc/go/internal/daemon"
)

func main() { os.Exit(daemon.Main(os.Args[1:])) }
