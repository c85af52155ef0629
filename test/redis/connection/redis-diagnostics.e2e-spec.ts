import { Cluster, Redis } from 'ioredis';
import { describeCause, describeTarget } from '../../../libs/rate-limit/src/stores/redis/redis-diagnostics.js';

describe('connection causes in words', () => {
  const error = (message: string, code?: string) => Object.assign(new Error(message), code ? { code } : {});
  it.each([
    [error('connect ECONNREFUSED 10.0.0.1:6379', 'ECONNREFUSED'), 'connection refused (connect ECONNREFUSED 10.0.0.1:6379)'],
    [error('getaddrinfo EAI_AGAIN redis', 'EAI_AGAIN'), 'host not found (getaddrinfo EAI_AGAIN redis)'],
    [
      error('WRONGPASS invalid username-password pair or user is disabled.'),
      'authentication failed: wrong username or password (WRONGPASS invalid username-password pair or user is disabled.)',
    ],
    [error('ERR invalid password'), 'authentication failed: wrong username or password (ERR invalid password)'],
    [
      error('NOAUTH Authentication required.'),
      'authentication required: the server asks for a password and none was given (NOAUTH Authentication required)',
    ],
    [
      error('self-signed certificate', 'DEPTH_ZERO_SELF_SIGNED_CERT'),
      'TLS handshake failed: self-signed certificate (DEPTH_ZERO_SELF_SIGNED_CERT): is the server certificate trusted (tls.ca) and issued for this host name?',
    ],
    [error('connect ETIMEDOUT', 'ETIMEDOUT'), 'connection timed out (connect ETIMEDOUT)'],
  ])('describes %s', (cause, words) => {
    expect(describeCause(cause)).toBe(words);
  });

  it('hints at TLS when a TLS connection times out', () => {
    expect(describeCause(error('connect ETIMEDOUT', 'ETIMEDOUT'), true)).toBe(
      'connection timed out (with TLS on, also check that the server speaks TLS on this port) (connect ETIMEDOUT)',
    );
  });
});

describe('where a client connects, in words', () => {
  it.each([
    [{ host: 'cache.internal', port: 6380 }, 'Redis at cache.internal:6380'],
    [{ host: 'cache.internal', port: 6380, tls: {} }, 'Redis at cache.internal:6380 (TLS)'],
    [{ path: '/run/redis.sock' }, 'Redis at /run/redis.sock'],
    [
      { sentinels: [{ host: 's1', port: 26379 }, { host: 's2' }], name: 'mymaster', password: 'pw' },
      'Redis master "mymaster" via sentinels s1:26379, s2:26379',
    ],
  ])('describes %j as %s', (options, text) => {
    const client = new Redis({ ...options, lazyConnect: true });
    expect(describeTarget(client)).toBe(text);
    client.disconnect();
  });

  it('describes a URL client by its host and port, without the password', () => {
    const client = new Redis('redis://:S3cret@cache.internal:6390/1', { lazyConnect: true });
    expect(describeTarget(client)).toBe('Redis at cache.internal:6390');
    client.disconnect();
  });

  it('describes a Cluster by its startup nodes', () => {
    const cluster = new Cluster([{ host: 'a', port: 7000 }, { host: 'b', port: 7001 }, 'redis://:S3cret@c:7002'], { lazyConnect: true });
    expect(describeTarget(cluster)).toBe('Redis Cluster (a:7000, b:7001, redis://:***@c:7002)');
    cluster.disconnect();
  });
});
