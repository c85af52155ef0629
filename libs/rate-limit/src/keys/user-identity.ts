/**
 * Where `keyBy: 'user'` looks for the user id when `keys.user` is not set, in order: `id`, then `userId`
 * (what the NestJS docs' passport-jwt strategy returns), then `sub` (a raw JWT payload, as the docs' own
 * auth guard puts it on `request.user`).
 */
export const USER_ID_FIELDS = ['id', 'userId', 'sub'] as const;

/** A value that can stand for a user: a non-empty string or a finite number. */
export function isUserId(value: unknown): value is string | number {
  return (typeof value === 'string' && value !== '') || (typeof value === 'number' && Number.isFinite(value));
}

/**
 * The first of `req.user.id`, `userId`, `sub` that is there (neither undefined nor null), if it is a user
 * id. A field that is there but holds something else (an object, NaN, '') decides too, as no id: the next
 * field may mean something else in that app, and a wrong bucket is worse than the IP's and a warning.
 */
export function defaultUserId(request: any): string | number | undefined {
  const user = request?.user;
  if (user === null || typeof user !== 'object') return undefined;
  for (const field of USER_ID_FIELDS) {
    const value = user[field];
    if (value !== undefined && value !== null) return isUserId(value) ? value : undefined;
  }
  return undefined;
}

/** Why `defaultUserId` found nothing: no `req.user` at all, or one without a usable id. */
export type MissingUser = { reason: 'no-user' } | { reason: 'no-id'; detail: string };

/** Explains a miss of `defaultUserId`, for the warning. Names the fields of `req.user`, never their values. */
export function whyNoUserId(request: any): MissingUser {
  const user = request?.user;
  if (user === undefined || user === null) return { reason: 'no-user' };
  if (typeof user !== 'object') return { reason: 'no-id', detail: `req.user is ${describeValue(user)}, not an object` };
  for (const field of USER_ID_FIELDS) {
    const value = user[field];
    if (value !== undefined && value !== null) {
      return { reason: 'no-id', detail: `req.user.${field} is ${describeValue(value)}, not a non-empty string or a finite number` };
    }
  }
  const fields = Object.keys(user).slice(0, 8);
  const listed =
    fields.length === 0 ? 'it has no fields' : `its fields: ${fields.join(', ')}${Object.keys(user).length > 8 ? ', ...' : ''}`;
  return { reason: 'no-id', detail: `req.user has no id, userId or sub (${listed})` };
}

/** A value's kind, and the value itself only where it cannot be personal data (numbers, booleans). */
function describeValue(value: unknown): string {
  if (value === undefined || value === null) return String(value);
  if (value === '') return 'an empty string';
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/**
 * The warning of a user-keyed policy that found no user id on a request (said once per route and
 * policy): what was looked for, why nothing was found, and what to do, which depends on whether the app
 * has a guard on the route. `custom`: the id came from `keys.user`, which returned `got`.
 */
export function noUserWarning(where: string, request: any, appGuards: boolean, custom?: { got: unknown }): string {
  const head = `keyBy 'user' on ${where} found no user id`;
  const fallback = 'those requests are limited by IP';
  const noUserAdvice = appGuards
    ? 'The guards on this route let it through without setting req.user (an anonymous request, if the route admits them, ' +
      'shares its IP bucket)'
    : 'No guard of the app runs on this route: if it is meant for signed-in users, put your auth guard on it (the ' +
      "policy is decided after the app's guards, so it sees the req.user they set)";
  if (custom !== undefined) {
    const missing = request?.user === undefined || request?.user === null;
    return (
      `${head}: keys.user returned ${describeValue(custom.got)}, not a non-empty ` +
      `string or a finite number; ${fallback}${missing ? `. This request has no req.user. ${noUserAdvice}` : ''}`
    );
  }
  const looked = `It looked for ${USER_ID_FIELDS.map((field) => `req.user.${field}`).join(', then ')} (a non-empty string or a finite number; the first one present decides); ${fallback}`;
  const miss = whyNoUserId(request);
  if (miss.reason === 'no-user') {
    return (
      `${head}: this request has no req.user. ${looked}. ${noUserAdvice}. If your app keeps the user ` +
      'elsewhere, say where: RateLimitModule.forRoot({ keys: { user: (req) => ... } })'
    );
  }
  return `${head}: ${miss.detail}. ${looked}. Say where the id is: RateLimitModule.forRoot({ keys: { user: (req) => req.user.<field> } })`;
}
