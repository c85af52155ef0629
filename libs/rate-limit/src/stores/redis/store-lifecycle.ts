import type { Cluster } from 'ioredis';
import { CONNECT_WAIT_MS } from '../../rate-limit.constants.js';
import type { RedisClient } from './redis-options.validation.js';

/** How long shutdown waits for QUIT's reply before it drops the connection (a paused Redis never answers). */
export const QUIT_WAIT_MS = 500;

/** Waits for `promise` at most `ms`; answers whether it settled in time. Leaves no timer behind. */
export async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(resolve, ms, false)));
  try {
    return await Promise.race([promise.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A Cluster opens its node connections on first use, and without an offline queue the commands that
 * arrive while one is opening fail: every master is connected before the first decision.
 */
export async function connectMasters(cluster: Cluster): Promise<void> {
  const pings = Promise.all(cluster.nodes('master').map((node) => node.ping().catch(() => undefined)));
  await settlesWithin(pings, CONNECT_WAIT_MS);
}

/**
 * Closes a client the module created: QUIT, so that commands in flight get their replies; but a hung
 * Redis (paused, overloaded, a dead network path) never answers it, so after `QUIT_WAIT_MS` the
 * connection is dropped and shutdown goes on.
 */
export async function quitOrDrop(client: RedisClient): Promise<void> {
  const quit = client.quit().then(
    () => true,
    () => false,
  );
  if (!(await settlesWithin(quit, QUIT_WAIT_MS)) || !(await quit)) client.disconnect();
}
