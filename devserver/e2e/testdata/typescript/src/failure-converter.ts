// The failure converter of remote-codec.ts, loaded by path as the TypeScript
// SDK asks: it encodes failure messages and stack traces as payloads, so
// that the codec encrypts them as the Go workers' failures are encrypted.
import { DefaultFailureConverter } from '@temporalio/common';

export const failureConverter = new DefaultFailureConverter({ encodeCommonAttributes: true });
