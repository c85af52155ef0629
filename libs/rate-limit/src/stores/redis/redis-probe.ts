import { Redis } from 'ioredis';

/**
 * Answers whether a Redis server responds to PING at `url` within `timeoutMs` (connection and reply
 * together), with a throwaway connection that neither retries nor lingers. Useful to choose
 * `store: 'memory'` at start-up when no Redis is there (the demo gateway does). A server that accepts
 * the connection and never replies (a frozen Redis, another service on the port) answers false when
 * the time is up.
 */
export async function redisAnswers(url: string, timeoutMs = 1000): Promise<boolean> {
  const client = new Redis(url, {
    lazyConnect: true,
    enableOfflineQueue: false,
    connectTimeout: timeoutMs,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    // A failed socket is already closed: don't keep a 2 s destroy timer alive after disconnect().
    disconnectTimeout: 10,
  });
  client.on('error', () => undefined);
  let timer: NodeJS.Timeout | undefined;
  const timeUp = new Promise<false>((resolve) => (timer = setTimeout(resolve, timeoutMs, false)));
  const answer = (async () => {
    await client.connect();
    return (await client.ping()) === 'PONG';
  })().catch(() => false);
  try {
    return await Promise.race([answer, timeUp]);
  } finally {
    clearTimeout(timer);
    client.disconnect();
  }
}
