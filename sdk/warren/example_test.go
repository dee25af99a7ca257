package warren_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warren-sandbox/warren/sdk/warren"
)

// Creates a sandbox, runs a script in it and removes it. It needs a live
// server (MSB_SERVER_URL, default http://127.0.0.1:5555), so it is compiled
// but not run by go test.
func Example() {
	ctx := context.Background()
	c := warren.New()
	sb, err := c.Create(ctx, warren.Spec{Name: "example", Image: "python", Labels: map[string]string{"team": "docs"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(context.WithoutCancel(ctx), sb.Name)

	res, err := sb.Shell(ctx, "echo hello; python3 --version", warren.ExecTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Output())
	fmt.Println("ok:", res.OK())
}

// A one-shot run: the sandbox is removed afterwards, whatever happens.
func ExampleClient_RunPython() {
	c := warren.New(warren.WithAPIKey("msb_..."))
	res, err := c.RunPython(context.Background(), "print(6*7)")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}

// Server failures have a kind.
func ExampleIsNotFound() {
	c := warren.New()
	_, err := c.Get(context.Background(), "no-such-sandbox")
	if warren.IsNotFound(err) {
		fmt.Println("not there:", err)
	}
}

// A background process, reattached by id and read as it runs.
func ExampleSandbox_StartProcess() {
	ctx := context.Background()
	sb := warren.New().Sandbox("example")
	p, err := sb.StartProcess(ctx, "sh", []string{"-c", "for i in 1 2 3; do echo $i; sleep 1; done"})
	if err != nil {
		log.Fatal(err)
	}
	var off int64
	for {
		chunk, err := sb.Process(p.ID).Output(ctx, warren.Stdout, off, 10*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(string(chunk.Data))
		off = chunk.NextOffset
		if chunk.EOF {
			break
		}
	}
}
