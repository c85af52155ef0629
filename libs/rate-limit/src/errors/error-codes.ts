/**
 * The library's error codes: one per kind of mistake or failure, each with the one line of help that
 * follows it in a configuration error's message. A code, once released, keeps its meaning; each has a
 * section of its own, under a heading that is the code, in docs/reference/errors.md (a test checks both
 * ways: every code here is thrown somewhere and documented there, and nothing else is).
 */
export const RATE_LIMIT_ERROR_CODES = {
  // Configuration: thrown at start-up, or at the call for BucketService and ConnectionRateLimit.
  ERR_RATE_LIMIT_UNKNOWN_OPTION: "Correct the key's spelling (the message names the closest known key) or remove it.",
  ERR_RATE_LIMIT_INVALID_OPTION: 'Give the option a value of the kind the message names, or leave it out for its default.',
  ERR_RATE_LIMIT_INVALID_REDIS_OPTION:
    'Give redis a redis:// or rediss:// URL, ioredis RedisOptions or a Redis / Cluster client, or leave it out for redis://127.0.0.1:6379.',
  ERR_RATE_LIMIT_REDIS_OPTION_UNDEFINED: 'Set the environment variable the value is read from, or leave the key out of the options.',
  ERR_RATE_LIMIT_REDIS_AUTH: "Check the user name and password (redis.username, redis.password or the URL's) against the server.",
  ERR_RATE_LIMIT_REDIS_TLS: 'Fix redis.tls (the CA, the server name), or use redis:// for a server without TLS.',
  ERR_RATE_LIMIT_REDIS_UNREACHABLE: "Check the host name, or use startupCheck: 'default' to start while it does not resolve.",
  ERR_RATE_LIMIT_REDIS_ACL: 'Grant the user the commands and the key pattern the message lists (ACL SETUSER).',
  ERR_RATE_LIMIT_REDIS_VERSION: 'Upgrade Redis to 7.0 or later.',
  ERR_RATE_LIMIT_INVALID_POLICY: 'Correct the value the message names, in the policy of the route or call it names.',
  ERR_RATE_LIMIT_LEASE_UNSUPPORTED:
    'Give the policy lease: false, or drop what the message names from it (a leased bucket has fixed numbers and no penalty).',
  ERR_RATE_LIMIT_CONCURRENCY_UNSUPPORTED:
    "Use store: 'redis' or 'memory' (or a store of your own with takeSlot and giveBackSlot) for @ConcurrencyLimit and takeSlot().",
  ERR_RATE_LIMIT_RESOLVER_NOT_INJECTABLE: 'Register the resolver class as a provider, or make its dependencies injectable.',
  ERR_RATE_LIMIT_POLICY_CONFLICT: "Give the policies that would share a bucket names of their own (name: '...'), or costs that fit.",
  ERR_RATE_LIMIT_INVALID_SKIP: '@SkipRateLimit() takes no argument, one boolean, or the names of policies that apply where it is.',
  ERR_RATE_LIMIT_MODULE_IMPORTED_TWICE: 'Import RateLimitModule.forRoot() once, in the root module, with isGlobal: true.',
  ERR_RATE_LIMIT_MODULE_NOT_IMPORTED: 'Add RateLimitModule.forRoot({ ... }) or forRootAsync({ ... }) to the imports of the root module.',
  ERR_RATE_LIMIT_PACED_UNBOUND:
    'Make the instance a provider of the application whose limits it uses (Nest then binds its @Paced calls to that application).',
  ERR_RATE_LIMIT_MODULE_WITHOUT_OPTIONS: 'Import RateLimitModule.forRoot({ ... }) or forRootAsync({ ... }), not RateLimitModule itself.',
  ERR_RATE_LIMIT_GUARD_NOT_REGISTERED:
    'Register RateLimitGuard (APP_GUARD, app.useGlobalGuards() or @UseGuards()), or remove guard: false.',
  ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED:
    "Add 'guards' and 'interceptors' to GraphQLModule's fieldResolverEnhancers, or put @SkipRateLimit() on the field resolver.",
  ERR_RATE_LIMIT_INVALID_CONSUME_ALL: 'Give each bucket of a consumeAll() call one policy, and costs that add up to at most its capacity.',
  ERR_RATE_LIMIT_UNKNOWN_SCOPE:
    "Pass a route policy's name (Controller.handler for an unnamed one) to the BucketService of RateLimitModule.",
  ERR_RATE_LIMIT_INVALID_IDENTITY: 'Pass exactly one of { ip }, { user }, { apiKey }, { id }, of a kind the policies of the scope key by.',
  ERR_RATE_LIMIT_ROUTE_NUMBERS_REQUIRED: 'Pass the numbers: peekRoute(scope, who, { capacity, refillPerSecond }).',
  ERR_RATE_LIMIT_OPERATIONS_OFF: 'Turn the operator side on: RateLimitModule.forRoot({ operations: true }).',
  ERR_RATE_LIMIT_OPERATIONS_STORE:
    "Use store: 'redis' (shared by every instance) or 'memory' (one process) with operations: a store of your own cannot hold them.",
  ERR_RATE_LIMIT_INVALID_OPERATION: 'Correct the field the message names: nothing was changed.',
  ERR_RATE_LIMIT_DASHBOARD_UNGUARDED:
    "Pass your app's auth: RateLimitDashboardModule.register({ guard: YourAdminGuard }), or unauthenticatedOnLoopback: true for this machine only.",
  // At run time: the message is left as it is, the code is in `code`.
  ERR_RATE_LIMIT_WAIT_TOO_LONG:
    'The tokens would come later than maxWaitMs allows (waitMs says when): nothing was reserved; try later, or allow a longer wait.',
  ERR_RATE_LIMIT_CONCURRENCY_LIMITED:
    'Every concurrency slot of the name is in use (inFlight says how many): nothing was held or run; try later (retryAfterSeconds is a hint), or wait with maxWaitMs.',
  ERR_RATE_LIMIT_TOO_MANY_WAITING:
    'More calls wait for tokens in this process than acquire.maxWaiting allows: slow the callers down, or raise the limit.',
  ERR_RATE_LIMIT_SHUTTING_DOWN: 'The application is closing: waits for tokens were ended and their reservations given back.',
  ERR_RATE_LIMIT_TIMEOUT: 'Redis did not answer within timeoutMs: failureMode answered; check Redis and the network, or raise timeoutMs.',
  ERR_RATE_LIMIT_REDIS_NOT_CONNECTED: 'The client is not connected: failureMode answers until Redis does; the logged cause says why.',
  ERR_RATE_LIMIT_UNAVAILABLE: "The store failed and failureMode is 'closed' (or the call cannot be answered otherwise): try again later.",
  ERR_RATE_LIMIT_UNUSABLE_KEY:
    "A bucket's key in Redis holds another type (another application's key, a bad migration): that decision followed failureMode; delete the key or use another keyPrefix.",
  ERR_RATE_LIMIT_STORE_CONTRACT:
    'A store broke the BucketStore contract: report it, or check a store of your own with verifyBucketStore().',
} as const;

/** A code of `RATE_LIMIT_ERROR_CODES`: `ERR_RATE_LIMIT_UNKNOWN_OPTION`, `ERR_RATE_LIMIT_INVALID_POLICY`, ... */
export type RateLimitErrorCode = keyof typeof RATE_LIMIT_ERROR_CODES;

/** The error reference, where every code has a heading of its own. */
export const ERROR_REFERENCE = 'https://github.com/nest-redis-rate-limit/nest-redis-rate-limit/blob/main/docs/reference/errors.md';

/** The address of a code's section in the error reference: its heading's anchor is the code in lower case. */
export function referenceOf(code: RateLimitErrorCode): string {
  return `${ERROR_REFERENCE}#${code.toLowerCase()}`;
}
