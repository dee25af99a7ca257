package image

import (
	"fmt"
	"slices"
)

// LangBin is the directory of the host image's skeleton that the language
// views put first on PATH. The host's /usr is bound read-only from the host,
// so the commands microsandbox's language images have and a Debian host
// names differently live here, as links into /usr/bin.
const LangBin = "/opt/warren/bin"

// langLinks are LangBin's entries: Debian installs python3 and pip3 (and,
// with python3-pip, pip), but "python" only with python-is-python3.
var langLinks = map[string]string{
	"python": "/usr/bin/python3",
	"pip":    "/usr/bin/pip3",
}

// langEnv is each language view's environment beyond PATH: what
// microsandbox's python and node images set, so code written against them
// behaves alike (unbuffered output, no .pyc files beside the code).
var langEnv = map[string][]string{
	"python": {"PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", "PIP_NO_CACHE_DIR=1"},
	"node":   {"NODE_ENV=development", "NPM_CONFIG_LOGLEVEL=info"},
}

// Languages are the languages Language knows.
var Languages = []string{"python", "node"}

// Language returns the host image as the language names (python, node)
// get it by default: the same root filesystem, with LangBin first on PATH
// (python, python3 and pip; node and npm are the host's own) and the
// language's environment. Commands run as root from /, as on the host
// image; microsandbox's images run as an unprivileged user in a work
// directory, which its examples do not depend on.
func Language(host *Image, lang string) (*Image, error) {
	env, ok := langEnv[lang]
	if !ok {
		return nil, fmt.Errorf("no language view %q of the host image (want one of %v)", lang, Languages)
	}
	img := *host
	img.Name = HostName + viewSep + lang
	img.Mounts = slices.Clone(host.Mounts)
	img.Layers = slices.Clone(host.Layers)
	img.Env = append([]string{
		"PATH=" + LangBin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "TERM=xterm",
	}, env...)
	return &img, nil
}
