// Start sandboxflow.RunCommand from a TypeScript client and read its result,
// first through the `result` Update (as soon as the command ended, before the
// lease is released), then as the workflow's own result.
import { Client, Connection } from '@temporalio/client';
import * as sf from './sandboxflow';

async function main(): Promise<void> {
  const client = new Client({ connection: await Connection.connect({ address: sf.address }), namespace: sf.namespace });
  const input: sf.RunCommandInput = { command: { argv: ['sh', '-c', 'echo hello from $0', 'typescript'], timeout: '30s' } };
  const handle = await client.workflow.start<sf.RunCommandWorkflow>(sf.runCommand, {
    taskQueue: sf.taskQueue,
    workflowId: `ts-runcommand-${Date.now()}`,
    args: [input],
  });
  const early = await handle.executeUpdate<sf.RunCommandResult, []>(sf.resultUpdate, { updateId: sf.resultUpdateId });
  const final = await handle.result();
  console.log(JSON.stringify({ early, final }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
