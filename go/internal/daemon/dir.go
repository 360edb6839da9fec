package daemon

// Files in the runtime directory.
const (
	SocketName = "daemon.sock"
	LockName   = "daemon.lock"
	LogName    = "daemon.log"
)
