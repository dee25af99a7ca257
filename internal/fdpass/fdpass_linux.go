// Package fdpass reads descriptors passed over unix sockets (SCM_RIGHTS),
// for the spawner's requests and the agent's config.
package fdpass

import "golang.org/x/sys/unix"

// Received returns the descriptors in a message's control data (oob as
// recvmsg filled it), skipping other kinds of control message. On error it
// closes what it found and returns none.
func Received(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			Close(fds)
			return nil, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// Close closes every descriptor in fds.
func Close(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
