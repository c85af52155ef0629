import { Redis } from 'ioredis';

/**
 * Answers whether a Redis server responds to PING at `url` within about `timeoutMs`, with a throwaway
 * connection that neither retries nor lingers. Useful to choose `store: 'memory'` at start-up when no
 * Redis is there (the demo gateway does).
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
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}
