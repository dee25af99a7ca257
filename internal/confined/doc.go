// Package confined implements the agent's file API: stat, list, read, write,
// mkdir, remove, move, and tar download/upload, all confined to one root
// directory (the sandbox's "/" in the agent, a t.TempDir() in tests).
//
// Every input — paths, tar streams, sizes — comes from an untrusted client,
// and the tree itself may be changed concurrently by hostile code inside the
// sandbox (for example swapping a directory for a symlink between two
// system calls). The package therefore never resolves a path as a string:
//
//   - Root holds an O_PATH descriptor of the root directory.
//   - Every lookup goes through openat2(2) relative to that descriptor with
//     RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS. The kernel treats the root as
//     "/" for the whole walk: ".." stops at it, absolute symlink targets
//     start at it, and /proc magic links are refused. Symlinks in the tree,
//     including ones swapped in concurrently, cannot lead outside.
//   - The final component is then acted on with *at system calls relative
//     to a descriptor of its parent (fstatat, mkdirat, unlinkat, renameat,
//     symlinkat, linkat, readlinkat), never through a re-joined path.
//   - Writes never follow a symlink at the final component: data goes to a
//     new temporary file created with O_EXCL in the parent, which is then
//     renamed over the target. Writing onto a symlink replaces the link.
//
// # Path rules
//
// Names are slash-separated and relative to the root. A leading "/" means
// the root, so "/etc/x" and "etc/x" name the same file; "", "/" and "." all
// name the root itself. Empty and "." components are dropped ("a//./b" is
// "a/b"). A name is rejected with kind invalid when it contains a ".."
// component, a NUL byte, is longer than 4096 bytes, or has a component
// longer than 255 bytes. Intermediate symlinks are followed, inside the
// root. Stat, Remove, Move and WriteTar act on a final symlink itself
// (lstat semantics); Open and List follow it (inside the root).
//
// # Tar
//
// WriteTar streams a regular file or symlink as one entry under its base
// name, and a directory as its contents with names relative to it (the
// directory itself has no entry), so that WriteTar(d) followed by
// ExtractTar(into e) makes e a copy of d. Symlinks are stored as symlinks and
// never followed; sockets, FIFOs and devices are skipped.
//
// ExtractTar treats the archive as hostile. Its destination directory acts as
// the root for the whole extraction: entry names follow the path rules
// relative to it ("/abs" lands in dest/abs, "../x" fails the extraction with
// kind invalid), symlinks in it, whether already there or created by earlier
// entries, are followed inside it, and hardlink targets must name an existing
// regular file inside it. The extraction stops at the first bad entry or
// exceeded limit; entries already written stay. See ExtractTar for details.
//
// Errors carry one of the wire.Err* kinds; Kind extracts it.
package confined
