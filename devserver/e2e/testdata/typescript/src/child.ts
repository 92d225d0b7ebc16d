// Run the TypeScript workflow of workflows.ts on a TypeScript worker and
// start it: it calls sandboxflow.RunCommand as a child workflow and returns
// the child's result.
import { Client, Connection } from '@temporalio/client';
import { NativeConnection, Worker } from '@temporalio/worker';
import * as sf from './sandboxflow';
import type { buildInSandbox } from './workflows';

const ownTaskQueue = 'sandboxflow-ts-examples';

async function main(): Promise<void> {
  const worker = await Worker.create({
    connection: await NativeConnection.connect({ address: sf.address }),
    namespace: sf.namespace,
    taskQueue: ownTaskQueue,
    workflowsPath: require.resolve('./workflows'),
  });
  const client = new Client({ connection: await Connection.connect({ address: sf.address }), namespace: sf.namespace });
  const result = await worker.runUntil(
    client.workflow.execute<typeof buildInSandbox>('buildInSandbox', {
      taskQueue: ownTaskQueue,
      workflowId: `ts-child-${Date.now()}`,
      args: [['sh', '-c', 'echo built by a child']],
    }),
  );
  console.log(JSON.stringify({ result }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
