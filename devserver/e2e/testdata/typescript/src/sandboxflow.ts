// The names and shapes of sandboxflow's workflows that these examples use,
// from docs/POLYGLOT.md. Every field, its type and what it means is in the
// JSON Schema docs/schema/sandboxflow.schema.json, generated from the Go
// types; these interfaces hold the fields the examples touch.

export const taskQueue = 'sandboxflow';
export const runCommand = 'sandboxflow.RunCommand';
export const session = 'sandboxflow.Session';
/** RunCommand's Update answering the command's result as soon as it ended. */
export const resultUpdate = 'result';
/** The Update id to send it with: asking again is free. */
export const resultUpdateId = 'sandboxflow-result';

/** A command: durations are Go duration strings ("10s") or nanoseconds. */
export interface Command {
  argv: string[];
  cwd?: string;
  env?: Record<string, string>;
  /** base64 */
  stdin?: string;
  timeout?: string | number;
}

/** RunCommandInput in the schema. */
export interface RunCommandInput {
  command: Command;
  secretEnv?: Record<string, string>;
  lease?: { shape?: string; egress?: string[]; autoPauseAfter?: string | number };
  keepLease?: boolean;
}

/** RunCommandResult in the schema. */
export interface RunCommandResult {
  exitCode: number;
  signal?: string;
  timedOut?: boolean;
  stdout?: string;
  stderr?: string;
  truncated?: boolean;
  leaseId: string;
  freshLeases: number;
  destroyedLeases?: string[];
}

/** The workflow RunCommand, as a TypeScript client types it. */
export type RunCommandWorkflow = (input: RunCommandInput) => Promise<RunCommandResult>;

/** SessionInput in the schema. */
export interface SessionInput {
  lease?: RunCommandInput['lease'];
  idleTimeout?: string | number;
}

/** SessionExecuteInput in the schema: the argument of the execute Update. */
export interface SessionCommand {
  command: Command;
  secretEnv?: Record<string, string>;
}

/** SessionExecuteResult in the schema: a RunCommandResult's command fields and the command's place. */
export interface SessionResult extends Omit<RunCommandResult, 'destroyedLeases'> {
  seq: number;
  workspaceReset?: boolean;
}

/** SessionCloseResult in the schema. */
export interface SessionSummary {
  commands: number;
  freshLeases: number;
  destroyedLeases?: string[];
}

/** The workflow Session, as a TypeScript client types it: its result is the close Update's. */
export type SessionWorkflow = (input: SessionInput) => Promise<SessionSummary>;

/** FailureDetails in the schema: the one details object of every failure. */
export interface FailureDetails {
  kind: string;
  retryable: boolean;
  field?: string;
  reason?: string;
  leaseId?: string;
}

/** Where the examples find Temporal: the dev stack's frontend by default. */
export const address = process.env.TEMPORAL_ADDRESS ?? 'localhost:7233';
export const namespace = process.env.TEMPORAL_NAMESPACE ?? 'default';
