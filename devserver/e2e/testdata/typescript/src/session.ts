// Open a sandboxflow session, run two commands on its one lease with the
// execute Update, read its state and close it.
import { Client, Connection } from '@temporalio/client';
import * as sf from './sandboxflow';

async function main(): Promise<void> {
  const client = new Client({ connection: await Connection.connect({ address: sf.address }), namespace: sf.namespace });
  const session = await client.workflow.start<sf.SessionWorkflow>(sf.session, {
    taskQueue: sf.taskQueue,
    workflowId: `ts-session-${Date.now()}`,
    args: [{ idleTimeout: '5m' }],
  });
  // The second command reads the file the first wrote: one lease, one workspace.
  const first = await session.executeUpdate<sf.SessionResult, [sf.SessionCommand]>('execute', {
    args: [{ command: { argv: ['sh', '-c', 'echo kept > f'] } }],
  });
  const second = await session.executeUpdate<sf.SessionResult, [sf.SessionCommand]>('execute', {
    args: [{ command: { argv: ['cat', 'f'] } }],
  });
  const state = await session.query<{ phase: string; commands: number }>('state');
  const summary = await session.executeUpdate<sf.SessionSummary, []>('close');
  await session.result();
  console.log(JSON.stringify({ first, second, state, summary }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
