import { Controller, Get, Headers, type OnModuleDestroy, Query, Res } from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import { Redis } from 'ioredis';
import { ConcurrencyLimit } from '../../../libs/rate-limit/src/index.js';

/** `/conc/held`: at most this many requests of one API key in flight, on all processes (the default lease, 30 s). */
export const HELD_LIMIT = 8;
/** `/conc/short-lease`: at most this many in flight per API key, each slot's lease this long (renewed every third). */
export const SHORT_LIMIT = 4;
export const SHORT_LEASE_MS = 1_000;

/**
 * The counters a handler of `route` keeps in Redis for one API key, under the worker's key prefix (never
 * a slot key: none holds `}!`): `in` the handlers running now, `started` and `ended` how many ever
 * entered and left, `gone` how many entered when their client had already closed the connection, `ids`
 * the `id` query parameter of every handler that started.
 */
export function handlerKeys(keyPrefix: string, route: 'held' | 'short-lease', apiKey: string) {
  const base = `${keyPrefix}handlers:${route}:${apiKey}:`;
  return { in: `${base}in`, started: `${base}started`, ended: `${base}ended`, gone: `${base}gone`, ids: `${base}ids` };
}

/** Express's response, or Fastify's reply. */
type Response = ServerResponse | { raw: ServerResponse };

/** What a concurrency-limited handler answers: how many handlers of its key ran when it entered, itself included. */
export interface HeldReply {
  seen: number;
  pid: number;
}

/**
 * Concurrency-limited routes (issue 36, item 1) for the multi-process tests: each handler counts itself
 * in Redis (`handlerKeys`) as it enters and leaves, so that what is in flight across processes is
 * measured by the handlers themselves, and holds for `ms` (a query parameter) in between.
 */
@Controller('conc')
export class ConcurrencyWorkerController implements OnModuleDestroy {
  private client: Redis | undefined;

  @Get('held')
  @ConcurrencyLimit({ limit: HELD_LIMIT, keyBy: 'apiKey', name: 'conc-held' })
  held(
    @Headers('x-api-key') apiKey: string,
    @Res({ passthrough: true }) response: Response,
    @Query('ms') ms?: string,
    @Query('id') id?: string,
  ) {
    return this.run('held', apiKey, response, ms, id);
  }

  @Get('short-lease')
  @ConcurrencyLimit({ limit: SHORT_LIMIT, keyBy: 'apiKey', name: 'conc-short', leaseMs: SHORT_LEASE_MS })
  shortLease(
    @Headers('x-api-key') apiKey: string,
    @Res({ passthrough: true }) response: Response,
    @Query('ms') ms?: string,
    @Query('id') id?: string,
  ) {
    return this.run('short-lease', apiKey, response, ms, id);
  }

  async onModuleDestroy(): Promise<void> {
    await this.client?.quit();
  }

  private async run(
    route: 'held' | 'short-lease',
    apiKey: string,
    response: Response,
    ms: string | undefined,
    id: string | undefined,
  ): Promise<HeldReply> {
    this.client ??= new Redis(process.env.REDIS_URL!);
    const keys = handlerKeys(process.env.KEY_PREFIX!, route, apiKey);
    const entering = this.client.multi().incr(keys.in).incr(keys.started);
    // Express's response is Node's; Fastify's reply holds it as `raw`. Destroyed: the client has gone.
    if (('raw' in response ? response.raw : response).destroyed) entering.incr(keys.gone);
    if (id !== undefined) entering.sadd(keys.ids, id);
    const replies = await entering.exec();
    const seen = Number(replies?.[0]?.[1]);
    try {
      await new Promise((resolve) => setTimeout(resolve, Number(ms ?? 0)));
    } finally {
      await this.client.multi().decr(keys.in).incr(keys.ended).exec();
    }
    return { seen, pid: process.pid };
  }
}
