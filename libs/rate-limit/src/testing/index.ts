/**
 * `nest-redis-rate-limit/testing`: helpers for tests, never loaded by the module itself. Needs
 * `fast-check` (an optional peer dependency: install it as a dev dependency to use this entry).
 */
export { verifyBucketStore, type VerifyBucketStoreOptions } from './verify-bucket-store.js';
