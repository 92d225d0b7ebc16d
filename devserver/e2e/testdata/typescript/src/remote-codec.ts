// Start sandboxflow.RunCommand on a stack whose workers encrypt, from a
// TypeScript client that holds no key: its payloads go through the stack's
// codec server (the remote codec of docs/POLYGLOT.md's Encryption section),
// which encrypts what the client writes and decrypts what it reads. Without
// it the workers refuse the input (plain-text input, SandboxInvalidInput).
//
// The codec server speaks Temporal's codec-server protocol: POST
// {"payloads": [...]} to /encode or /decode, each payload's metadata values
// and data in base64. Failure messages and stack traces are payloads too
// (encodeCommonAttributes, in failure-converter.ts), as the Go workers write
// them.
import { Client, Connection } from '@temporalio/client';
import type { Payload, PayloadCodec } from '@temporalio/common';
import * as sf from './sandboxflow';

/** A PayloadCodec that asks the codec server at url. */
class RemoteCodec implements PayloadCodec {
  constructor(private readonly url: string, private readonly namespace: string) {}

  encode(payloads: Payload[]): Promise<Payload[]> {
    return this.call('encode', payloads);
  }

  decode(payloads: Payload[]): Promise<Payload[]> {
    return this.call('decode', payloads);
  }

  private async call(op: 'encode' | 'decode', payloads: Payload[]): Promise<Payload[]> {
    const response = await fetch(`${this.url}/${op}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-Namespace': this.namespace },
      body: JSON.stringify({ payloads: payloads.map(toJSON) }),
    });
    if (!response.ok) {
      throw new Error(`codec server: ${op}: HTTP ${response.status}: ${await response.text()}`);
    }
    const body = (await response.json()) as { payloads?: JSONPayload[] };
    return (body.payloads ?? []).map(fromJSON);
  }
}

interface JSONPayload {
  metadata?: Record<string, string>;
  data?: string;
}

function toJSON(p: Payload): JSONPayload {
  const metadata: Record<string, string> = {};
  for (const [k, v] of Object.entries(p.metadata ?? {})) {
    if (v) metadata[k] = Buffer.from(v).toString('base64');
  }
  return { metadata, data: Buffer.from(p.data ?? new Uint8Array()).toString('base64') };
}

function fromJSON(p: JSONPayload): Payload {
  const metadata: Record<string, Uint8Array> = {};
  for (const [k, v] of Object.entries(p.metadata ?? {})) {
    metadata[k] = Buffer.from(v, 'base64');
  }
  return { metadata, data: Buffer.from(p.data ?? '', 'base64') };
}

async function main(): Promise<void> {
  const codecURL = process.env.SANDBOXFLOW_CODEC_URL;
  if (!codecURL) throw new Error('SANDBOXFLOW_CODEC_URL: the codec server, e.g. http://127.0.0.1:8234');
  const client = new Client({
    connection: await Connection.connect({ address: sf.address }),
    namespace: sf.namespace,
    dataConverter: {
      payloadCodecs: [new RemoteCodec(codecURL, sf.namespace)],
      failureConverterPath: require.resolve('./failure-converter'),
    },
  });
  const input: sf.RunCommandInput = { command: { argv: ['sh', '-c', 'echo encrypted from typescript'], timeout: '30s' } };
  const handle = await client.workflow.start<sf.RunCommandWorkflow>(sf.runCommand, {
    taskQueue: sf.taskQueue,
    workflowId: `ts-remote-codec-${Date.now()}`,
    args: [input],
  });
  const result = await handle.result();
  // What the Temporal server holds of the input: the encoding of the first
  // payload of the workflow's first event, as any reader of the history sees it.
  const history = await handle.fetchHistory();
  const stored = history.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0];
  const storedEncoding = Buffer.from(stored?.metadata?.encoding ?? new Uint8Array()).toString();
  console.log(JSON.stringify({ result, storedEncoding }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
