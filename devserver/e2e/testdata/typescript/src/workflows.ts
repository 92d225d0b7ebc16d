// A TypeScript workflow that runs a command in a sandbox as a child
// workflow: sandboxflow.RunCommand, on the sandboxflow workers' task queue.
import { executeChild, ParentClosePolicy } from '@temporalio/workflow';
import type { RunCommandInput, RunCommandResult } from './sandboxflow';

export async function buildInSandbox(argv: string[]): Promise<RunCommandResult> {
  const input: RunCommandInput = { command: { argv, timeout: '10m' } };
  return executeChild('sandboxflow.RunCommand', {
    taskQueue: 'sandboxflow',
    args: [input],
    // REQUEST_CANCEL, not the SDK's default TERMINATE: when this workflow
    // closes first, the child is cancelled and releases its lease itself
    // (kills the command, destroys the lease); a terminated child cannot,
    // and leaves its lease to the reaper until it sweeps.
    parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
  });
}
