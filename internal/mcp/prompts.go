package mcp

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// PromptNames lists the prompts Handler offers: microsandbox's two, with
// the same names and arguments, so a client that offers them to its user
// finds them here too.
var PromptNames = []string{"create_python_sandbox", "create_node_sandbox"}

// languagePrompt is a prompt that has the model start a sandbox for one
// language.
type languagePrompt struct {
	name, language, image, replLanguage, defaultName string
}

var languagePrompts = []languagePrompt{
	{"create_python_sandbox", "Python", "python", "python", "python-sandbox"},
	{"create_node_sandbox", "Node.js", "node", "node", "node-sandbox"},
}

// promptName is the API's rule for sandbox and namespace names: a prompt
// argument that breaks it would only make the tool call fail later, so the
// prompt refuses it (and never repeats a long or odd string back).
// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var promptName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`) })

func addPrompts(s *sdk.Server) {
	for _, p := range languagePrompts {
		s.AddPrompt(&sdk.Prompt{
			Name:        p.name,
			Title:       "Create a " + p.language + " sandbox",
			Description: "Start a sandbox for running " + p.language + " code, and say how to use it.",
			Arguments: []*sdk.PromptArgument{
				{Name: "sandbox_name", Description: "name of the new sandbox (default " + p.defaultName + ")", Required: true},
				{Name: "namespace", Description: "namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"},
			},
		}, p.get)
	}
}

func (p languagePrompt) get(_ context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
	args := req.Params.Arguments
	name := args["sandbox_name"]
	if name == "" {
		name = p.defaultName
	}
	ns := args["namespace"]
	for what, v := range map[string]string{"sandbox_name": name, "namespace": ns} {
		if v != "" && !promptName().MatchString(v) {
			return nil, fmt.Errorf("prompt %s: argument %s: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", p.name, what)
		}
	}
	where, nsArg := "", ""
	if ns != "" {
		where, nsArg = fmt.Sprintf(" in namespace %q", ns), fmt.Sprintf(`"namespace": %q, `, ns)
	}
	text := fmt.Sprintf("Set up a %s sandbox named %q%s. Call the sandbox_start tool with "+
		`{"sandbox": %q, %s"config": {"image": %q, "memory": 512, "cpus": 1}}. `+
		"When it has started, run %s code in it with sandbox_run_code (language %q): "+
		"variables and imports persist from one run to the next. Use sandbox_run_command for programs and "+
		"sandbox_write_file and sandbox_read_file for files. Call sandbox_stop when you are done with it.",
		p.language, name, where, name, nsArg, p.image, p.language, p.replLanguage)
	return &sdk.GetPromptResult{
		Description: "Create a " + p.language + " sandbox",
		Messages:    []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: text}}},
	}, nil
}
