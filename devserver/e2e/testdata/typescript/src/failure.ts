// A failure of sandboxflow reaching TypeScript: RunCommand given a timeout
// that is no duration fails, before any lease is created, as an
// ApplicationFailure of type SandboxInvalidInput whose details name the
// field by its JSON path.
import { ApplicationFailure, Client, Connection, WorkflowFailedError } from '@temporalio/client';
import * as sf from './sandboxflow';

/** The ApplicationFailure behind a client error: the workflow's failure or one it wraps. */
function applicationFailure(err: unknown): ApplicationFailure | undefined {
  let f: unknown = err instanceof WorkflowFailedError ? err.cause : err;
  while (f instanceof Error && !(f instanceof ApplicationFailure)) f = f.cause;
  return f instanceof ApplicationFailure ? f : undefined;
}

async function main(): Promise<void> {
  const client = new Client({ connection: await Connection.connect({ address: sf.address }), namespace: sf.namespace });
  try {
    await client.workflow.execute<sf.RunCommandWorkflow>(sf.runCommand, {
      taskQueue: sf.taskQueue,
      workflowId: `ts-failure-${Date.now()}`,
      args: [{ command: { argv: ['true'], timeout: 'ten seconds' } }], // not a Go duration
    });
    throw new Error('RunCommand took a timeout that is no duration');
  } catch (err) {
    const f = applicationFailure(err);
    if (!f) throw err;
    const details = f.details?.[0] as sf.FailureDetails | undefined;
    console.log(JSON.stringify({ type: f.type, nonRetryable: f.nonRetryable, details }));
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
