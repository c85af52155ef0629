import { BadRequestException } from '@nestjs/common';

/**
 * The shapes of what the page sends, checked before anything is asked of `RateLimitInsights`: an object
 * (or query) with only the fields named here, each of its type, length or range. A failure is a 400 that
 * names the field; `RateLimitInsights` then checks what only it knows (the scope exists, the identity is
 * as the limiter keys it). `by` is never a field: the operator comes from the request's auth.
 */

type FieldKind =
  | { type: 'text'; max: number; required?: boolean }
  | { type: 'integer'; min: number; max: number; required?: boolean }
  | { type: 'number'; min: number; max: number; required?: boolean }
  | { type: 'boolean'; required?: boolean }
  | { type: 'choice'; values: readonly string[]; required?: boolean };

export type Shape = Record<string, FieldKind>;

const SCOPE = { type: 'text', max: 200, required: true } as const;
const IDENTITY = { type: 'text', max: 100 } as const;
const REASON = { type: 'text', max: 200 } as const;
const MAX_SECONDS = 30 * 24 * 3600;

export const SHAPES = {
  series: { scope: SCOPE, seconds: { type: 'integer', min: 60, max: 3600 } },
  top: { scope: SCOPE, by: { type: 'choice', values: ['refused', 'allowed'] }, window: { type: 'integer', min: 60, max: 86_400 } },
  identity: { scope: SCOPE, identity: { ...IDENTITY, required: true } },
  block: {
    target: { type: 'text', max: 100, required: true },
    seconds: { type: 'integer', min: 1, max: MAX_SECONDS, required: true },
    reason: { ...REASON, required: true },
  },
  unblock: { target: { type: 'text', max: 100, required: true }, reason: REASON },
  override: {
    scope: SCOPE,
    identity: IDENTITY,
    capacity: { type: 'integer', min: 1, max: 1e9 },
    refillPerSecond: { type: 'number', min: Number.MIN_VALUE, max: 1e9 },
    enforce: { type: 'boolean' },
    ttlSeconds: { type: 'integer', min: 1, max: MAX_SECONDS },
    reason: { ...REASON, required: true },
  },
  clearOverride: { scope: SCOPE, identity: IDENTITY, reason: REASON },
  reset: { scope: SCOPE, identity: { ...IDENTITY, required: true }, reason: REASON },
} satisfies Record<string, Shape>;

function bad(message: string): never {
  throw new BadRequestException(message);
}

/**
 * `input` checked against `shape`: a body (JSON types) or, with `fromQuery`, a query string whose
 * numbers arrive as text. Answers the fields present, with their types.
 */
export function checked(input: unknown, shape: Shape, fromQuery = false): Record<string, string | number | boolean> {
  if (typeof input !== 'object' || input === null || Array.isArray(input))
    bad(fromQuery ? 'the query is missing' : 'the body must be a JSON object');
  const fields = input as Record<string, unknown>;
  const result: Record<string, string | number | boolean> = {};
  for (const key of Object.keys(fields)) {
    if (!Object.hasOwn(shape, key)) bad(`unknown field ${JSON.stringify(key.slice(0, 40))} (expected ${Object.keys(shape).join(', ')})`);
  }
  for (const [name, kind] of Object.entries(shape)) {
    let value = fields[name];
    if (value === undefined || (fromQuery && value === '' && !kind.required)) {
      if (kind.required) bad(`${name} is required`);
      continue;
    }
    if (fromQuery && typeof value !== 'string') bad(`${name} must be given once`);
    switch (kind.type) {
      case 'text':
        if (typeof value !== 'string' || value.trim() === '') bad(`${name} must be a non-empty string`);
        if (value.length > kind.max) bad(`${name} must be at most ${kind.max} characters (got ${value.length})`);
        // eslint-disable-next-line no-control-regex
        if (/[\u0000-\u001f\u007f]/.test(value)) bad(`${name} must not contain control characters`);
        break;
      case 'integer':
      case 'number':
        if (fromQuery) value = /^\d{1,12}$/.test(value as string) ? Number(value) : NaN;
        if (typeof value !== 'number' || !Number.isFinite(value)) bad(`${name} must be a number`);
        if (kind.type === 'integer' && !Number.isInteger(value)) bad(`${name} must be a whole number (got ${value})`);
        if (value < kind.min || value > kind.max) {
          bad(
            `${name} must be ${kind.min === Number.MIN_VALUE ? 'above 0' : `at least ${kind.min}`} and at most ${kind.max} (got ${value})`,
          );
        }
        break;
      case 'boolean':
        if (typeof value !== 'boolean') bad(`${name} must be true or false`);
        break;
      case 'choice':
        if (typeof value !== 'string' || !kind.values.includes(value)) bad(`${name} must be one of ${kind.values.join(', ')}`);
        break;
    }
    result[name] = value as string | number | boolean;
  }
  return result;
}
