package msb_test

import (
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/warren-sandbox/warren/sdk/msb"
)

// Runs Python code and a command in a sandbox on the server named by
// MSB_SERVER_URL (default http://127.0.0.1:5555). go test runs it against a
// real server (see the module's internal/testserver).
func Example() {
	sandbox := msb.NewPythonSandbox(msb.WithName("example"), msb.WithTimeout(30*time.Second))
	if err := sandbox.Start(msb.StartConfig{Memory: 512, CPUs: 1}); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = sandbox.Stop() }()

	execution, err := sandbox.Code().Run("print('Hello World')")
	if err != nil {
		log.Fatal(err)
	}
	output, _ := execution.GetOutput()
	fmt.Println(output)

	cmd, err := sandbox.Command().Run("ls", []string{"-la", "/"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", cmd.GetExitCode())

	metrics, err := sandbox.Metrics().All()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("running:", metrics.IsRunning, "memory reported:", metrics.MemoryMiB > 0)
	// Output:
	// Hello World
	// exit code: 0
	// running: true memory reported: true
}

// Server failures carry the server's message and error kind. (Not run by
// go test: the test server runs without API keys.)
func ExampleRPCError() {
	sandbox := msb.NewNodeSandbox(msb.WithApiKey("msb_..."))
	err := sandbox.Start(msb.StartConfig{})
	var rpcErr *msb.RPCError
	if errors.As(err, &rpcErr) && rpcErr.Kind == "unauthorized" {
		fmt.Println("check MSB_API_KEY:", rpcErr.Message)
	}
}
