import type { RouteIdentity } from '../keys/identity-keys.js';
import type { BucketPolicy } from '../rate-limit.interfaces.js';
import type { BucketRequest } from '../stores/token-bucket.js';

/**
 * The buckets of the route policies, by scope, for `BucketService.peekRoute()` / `resetRoute()`. The
 * policies know them (`PolicyRouteBuckets`, which `RateLimitModule` provides under this token); the
 * service only asks, so that it knows nothing of routes. `who` has been checked; `where` names the call
 * in the errors.
 */
export abstract class RouteBuckets {
  /** The request `peekRoute()` decides: the bucket's key, its numbers (`policy`'s, else the scope's) and a cost. */
  abstract peekRequest(
    scope: string,
    who: RouteIdentity,
    policy: (BucketPolicy & { cost?: number }) | undefined,
    where: string,
  ): BucketRequest;

  /** The key of the bucket of `who` for the route policy `scope`. */
  abstract keyOf(scope: string, who: RouteIdentity, where: string): string;
}
