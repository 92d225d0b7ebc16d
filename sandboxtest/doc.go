// Package sandboxtest wires RunCommand and its activities into the Temporal
// SDK's test environment, for unit tests of workflows that run commands
// with a fake, mocked or real provider:
//
//	env := sandboxtest.NewWorkflowEnvironment(provider)
//	env.ExecuteWorkflow(workflows.WorkflowName, workflows.Request{…})
//
// Two neighbours complete it: package faultproxy puts real failures between
// a client and any CreateOS-compatible server, and package
// localsandbox/localsandboxtest (in the server's module, Linux only) starts
// the local sandbox server and checks that nothing leaked.
package sandboxtest
