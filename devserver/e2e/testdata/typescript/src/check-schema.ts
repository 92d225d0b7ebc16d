// Not an example: the test's check that what the examples received fits
// docs/schema/sandboxflow.schema.json. It reads [{"message": "RunCommandResult",
// "value": {...}}, ...] on stdin and writes, for each, whether the value
// validates against that message of the schema (SANDBOXFLOW_SCHEMA, a path).
import { readFileSync } from 'node:fs';
import Ajv2020 from 'ajv/dist/2020';

const schema = JSON.parse(readFileSync(process.env.SANDBOXFLOW_SCHEMA ?? '', 'utf8'));
// Union types (["array", "null"]) are the schema's; formats are not checked.
const ajv = new Ajv2020({ allowUnionTypes: true, validateFormats: false });
ajv.addSchema(schema);

const checks: { message: string; value: unknown }[] = JSON.parse(readFileSync(0, 'utf8'));
for (const { message, value } of checks) {
  const validate = ajv.getSchema(`${schema.$id}#/$defs/${message}`);
  if (!validate) throw new Error(`no message ${message} in the schema`);
  const ok = validate(value);
  console.log(JSON.stringify({ message, ok, errors: ok ? undefined : ajv.errorsText(validate.errors) }));
}
