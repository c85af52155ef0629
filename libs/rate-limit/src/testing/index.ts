/**
 * `nest-redis-rate-limit/testing`: helpers for tests, never loaded by the module itself.
 * `createRedisTestPrefix` needs nothing more than the package's peers; `verifyBucketStore` needs
 * `fast-check` (an optional peer dependency: install it as a dev dependency to use it), which is loaded
 * only when it is called.
 */
import type { BucketStore } from '../stores/bucket-store.interface.js';
import type { VerifyBucketStoreOptions } from './verify-bucket-store.js';

export { createRedisTestPrefix, type RedisTestPrefix, type RedisTestPrefixOptions } from './redis-test-prefix.js';
export type { VerifyBucketStoreOptions } from './verify-bucket-store.js';

/**
 * Checks a `BucketStore` against the library's reference model of the token bucket, the property test the
 * Redis script and the memory store pass: fast-check draws policies and sequences of take, peek (`dryRun`),
 * refund and reset (`delete`) over up to three keys, with a simulated clock (`TakeOptions.now` must be
 * honoured as the store's clock); every reply must match the model. Resolves when all did; rejects with the
 * first mismatch, shrunk to a short sequence, and the seed that replays it. Framework-neutral: call it in a
 * Jest, Vitest or node:test case. Loads `fast-check` (an optional peer) when called.
 *
 * ```ts
 * it('keeps the BucketStore contract', () => verifyBucketStore(new MyStore(client), { runs: 200 }), 60_000);
 * ```
 */
export async function verifyBucketStore(store: BucketStore, options: VerifyBucketStoreOptions = {}): Promise<void> {
  const { verifyBucketStore: verify } = await import('./verify-bucket-store.js');
  return verify(store, options);
}
