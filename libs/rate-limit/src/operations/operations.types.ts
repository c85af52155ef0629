/**
 * What the operator's side of the limiter reads and writes: analytics of decisions, live overrides of
 * named policies, the deny list, and the audit trail of every change.
 *
 * An identity here is always as the limiter keys it (`KeyedIdentity`), never a raw API key.
 */

/**
 * An identity as it appears in bucket keys: `ip:203.0.113.7`, `ip:2001:db8:1:2::` (an IPv6 /64),
 * `user:42`, `user~<digest>` (a long or unusual id), `key:<digest>` (an API key's HMAC/SHA-256 digest),
 * `id:<value>` or `id~<digest>` (what a keyBy function returned).
 */
export type KeyedIdentity = string;

/** One identity's counts over a window. Counts of identities that left an instance's top K are lower bounds. */
export interface TopIdentity {
  identity: KeyedIdentity;
  allowed: number;
  refused: number;
}

/** Decisions of one policy in one second (epoch seconds). */
export interface SeriesPoint {
  at: number;
  allowed: number;
  refused: number;
}

/** A change of a named policy's numbers or mode, for every identity or for one. */
export interface OverrideInput {
  /** The policy's scope: its `name`, or `Controller.handler` for an unnamed one. */
  scope: string;
  /** One identity (`user:42`, `key:<digest>`, `ip:…`), or every identity when absent. */
  identity?: KeyedIdentity;
  /** Burst, an integer >= 1 (default: the code's). */
  capacity?: number;
  /** Tokens per second, > 0 (default: the code's). */
  refillPerSecond?: number;
  /** `false`: shadow mode (decide and drain, never refuse); `true`: enforce (default: the code's). */
  enforce?: boolean;
  /** Seconds the override lasts; absent: until cleared. */
  ttlSeconds?: number;
  /** Why (written to the audit trail); 1 to 200 characters. */
  reason: string;
  /** Who (the operator, as the app's auth knows them); 1 to 100 characters. */
  by: string;
}

/** An override in force. */
export interface OverrideEntry {
  scope: string;
  identity?: KeyedIdentity;
  capacity?: number;
  refillPerSecond?: number;
  enforce?: boolean;
  reason: string;
  by: string;
  /** When it was set (epoch ms). */
  at: number;
  /** When it ends (epoch ms), or undefined: until cleared. */
  until?: number;
}

/**
 * What a block refuses: an identity as the limiter keys it (`ip:203.0.113.7`, `user:42`, `key:<digest>`,
 * `id:…`), or an address range `ip:10.0.0.0/8`, `ip:2001:db8::/32`.
 */
export type BlockTarget = string;

export interface BlockInput {
  target: BlockTarget;
  /** How long, in seconds (1 to 30 days). */
  seconds: number;
  reason: string;
  by: string;
}

/** A block in force. */
export interface BlockEntry {
  target: BlockTarget;
  reason: string;
  by: string;
  /** Set at (epoch ms). */
  at: number;
  /** Ends at (epoch ms). */
  until: number;
}

export type AuditAction = 'block' | 'unblock' | 'override' | 'clear-override' | 'reset';

/** One change, as the audit trail keeps it (newest first, the last 1,000). */
export interface AuditEntry {
  at: number;
  by: string;
  action: AuditAction;
  /** The policy's scope, for overrides and resets. */
  scope?: string;
  /** The identity or range, when the change names one. */
  target?: string;
  reason?: string;
  /** What was set: the override's numbers, the block's end. */
  detail?: Record<string, unknown>;
}

/** A named policy as code defines it, and what overrides it for every identity. */
export interface PolicyView {
  scope: string;
  /** The code's numbers; undefined when they are computed per request (functions or a resolver). */
  capacity?: number;
  refillPerSecond?: number;
  enforce: boolean;
  keyBy: 'ip' | 'user' | 'apiKey' | 'function';
  /** `Controller.handler` of every route that uses it. */
  routes: string[];
  /** The override of every identity, when one is in force. */
  override?: OverrideEntry;
  /** How many per-identity overrides are in force. */
  identityOverrides: number;
}

/** One identity's bucket of one policy, now. */
export interface IdentityInspection {
  scope: string;
  identity: KeyedIdentity;
  /** Numbers it is decided with now (the code's, or an override's). */
  capacity: number;
  refillPerSecond: number;
  enforce: boolean;
  /** Whole tokens now (0 while a penalty holds). */
  tokens: number;
  /** Seconds until the bucket is full. */
  secondsToFull: number;
  /** Seconds until the next request of cost 1 could pass (0: it would pass now). */
  retryAfterSeconds: number;
  /** The override in force for this identity (its own, else the policy's). */
  override?: OverrideEntry;
  /** The block in force for this identity (its own, or a range that holds it). */
  block?: BlockEntry;
}
