package warren_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warren-sandbox/warren/sdk/warren"
)

// Creates a sandbox, runs a script in it and removes it. go test runs the
// examples against a real server (see the module's internal/testserver);
// yours is MSB_SERVER_URL, default http://127.0.0.1:5555.
func Example() {
	ctx := context.Background()
	c := warren.New()
	sb, err := c.Create(ctx, warren.Spec{Name: "example", Image: "python", Labels: map[string]string{"team": "docs"}})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Remove(context.WithoutCancel(ctx), sb.Name) }()

	res, err := sb.Shell(ctx, "echo hello; python3 -c 'print(6*7)'", warren.ExecTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Output())
	fmt.Println("ok:", res.OK())
	// Output:
	// hello
	// 42
	// ok: true
}

// A one-shot run: the sandbox is removed afterwards, whatever happens.
func ExampleClient_RunPython() {
	c := warren.New() // MSB_SERVER_URL and MSB_API_KEY
	res, err := c.RunPython(context.Background(), "print(6*7)")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	// Output: 42
}

// Server failures have a kind.
func ExampleIsNotFound() {
	c := warren.New()
	_, err := c.Get(context.Background(), "no-such-sandbox")
	if warren.IsNotFound(err) {
		fmt.Println("not there")
	}
	// Output: not there
}

// A background process, reattached by id and read as it runs.
func ExampleSandbox_StartProcess() {
	ctx := context.Background()
	c := warren.New()
	sb, err := c.Create(ctx, warren.Spec{Name: "example-process"})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Remove(context.WithoutCancel(ctx), sb.Name) }()

	p, err := sb.StartProcess(ctx, "sh", []string{"-c", "for i in 1 2 3; do echo $i; sleep 0.1; done"})
	if err != nil {
		log.Fatal(err)
	}
	var off int64
	for {
		// Another client could do the same with only the id.
		chunk, err := c.Sandbox(sb.Name).Process(p.ID).Output(ctx, warren.Stdout, off, 10*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(string(chunk.Data))
		off = chunk.NextOffset
		if chunk.EOF {
			break
		}
	}
	// Output:
	// 1
	// 2
	// 3
}
