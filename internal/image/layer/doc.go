// Package layer unpacks one OCI/Docker image layer (an already decompressed
// tar stream) into an empty directory that is then used as an overlayfs
// lower layer.
//
// The caller unpacks into a fresh temporary directory and renames it into the
// layer store only when Unpack succeeds; on error the directory holds a
// partial layer and the caller deletes it. Unpack requires the directory to
// be empty, because everything it finds there is taken to come from this
// layer.
//
// The archive is untrusted. The rules:
//
//   - Names are relative to the directory. A leading "/" and "./" are
//     stripped (layer tars use relative names, some writers add them), empty
//     and "." components are dropped, and a ".." component or a NUL byte
//     fails the unpack. An entry naming the directory itself ("./") sets the
//     directory's metadata.
//   - Every lookup is relative to a directory descriptor and never follows a
//     symlink: parents are opened with openat2 RESOLVE_BENEATH |
//     RESOLVE_NO_SYMLINKS, the final component with *at calls that do not
//     follow it. An entry whose parent path crosses a symlink fails the
//     unpack (symlink-then-write tar-slip). Missing parents are created
//     (mode 0755, owned by the shifted root) and count as entries.
//   - Symlinks are created with their target text verbatim; it is never
//     followed here. Hardlinks must name a regular file already unpacked in
//     this layer, under the same name rules.
//   - Later entries replace earlier ones: a file, symlink, device or
//     whiteout is replaced; a directory replacing a directory keeps its
//     contents (its metadata is updated); a non-directory may replace only
//     an empty directory (a non-empty one fails the unpack).
//   - OCI whiteouts become overlayfs whiteouts: "a/.wh.name" becomes a
//     character device 0/0 "a/name", and "a/.wh..wh..opq" marks directory
//     "a" opaque with the xattr trusted.overlay.opaque=y (user.overlay.opaque=y
//     with Options.UserXattr, for overlays mounted with userxattr). Any other
//     ".wh." name (".wh..wh.plnk", ".wh.", a ".wh." directory component) is
//     invalid. Whiteouts hide lower layers only: a whiteout for a name this
//     layer already holds does not remove it (a directory becomes opaque),
//     and a directory that replaces a whiteout of this layer is made opaque.
//   - Permission bits and the sticky bit are kept, and a directory's setgid
//     bit; setuid and setgid are stripped from everything else. They never
//     worked inside a sandbox (its processes run with no_new_privs), and on
//     the host they would lend a sandbox uid to anyone reaching the layer.
//     Ownership is shifted by
//     Options.IDShift and applied with lchown semantics; an owner outside the
//     map fails the unpack (no silent clamping to an overflow id).
//   - Modification times are restored (directories' at the end, after their
//     contents are written); access times are set equal to them.
//   - Extended attributes come from PAX SCHILY.xattr.* records, on regular
//     files and directories only. Only user.* (except user.overlay.*) and
//     security.capability are applied: trusted.* and user.overlay.* would
//     forge overlayfs metadata (opaque, redirect, metacopy), security.* labels
//     (SELinux, IMA/EVM) belong to the host's policy, and system.posix_acl_*
//     name host uids that are not shifted. security.capability must be a v2
//     or v3 record; its root id is shifted like an owner and it is written as
//     v3 with the shifted root id (v2 when that is host uid 0), so the file
//     capabilities hold inside the sandbox's user namespace. Names are at
//     most 255 bytes and values 64 KiB.
//   - Character and block devices and FIFOs are skipped by default (counted
//     in Stats.Skipped); with CreateDevices they are made with mknod, and
//     numbers beyond the kernel's (12-bit major, 20-bit minor) are refused. A
//     character device 0/0 entry is always skipped: overlayfs would read it
//     as a whiteout.
//   - Limits (Options.MaxBytes, MaxEntries) are enforced while streaming.
//     Sizes in headers are never trusted for allocation: a header larger than
//     the remaining byte budget fails at once, and a short body fails when
//     the stream ends.
package layer
