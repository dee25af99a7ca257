// Package setup is the agent's work as PID 1: it stages the standard
// mounts of a pooled agent while it waits (Stage), turns the process into
// the sandbox's init from the host's boot.Config (Apply: the root
// filesystem, masks, limits, the seccomp filter), keeps the Launcher thread
// every sandbox process is forked from, and reaps orphans (Reaper).
//
// It runs before the agent serves anything; package service is what it
// serves.
package setup
