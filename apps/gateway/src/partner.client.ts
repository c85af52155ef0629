import { Injectable } from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import { Paced } from 'nest-redis-rate-limit';
import { FakePartner } from './fake-partner.js';

/**
 * The client of a partner API that allows 5 calls per second for the whole account. `@Paced` makes
 * every call wait for its turn in one bucket in Redis, shared by every instance of the gateway: a burst
 * of 5, then 5 per second for all of them together, first come first served. A call whose turn is more
 * than 3 s away rejects at once with `RateLimitWaitTooLongError` (PartnerController answers 503).
 */
@Injectable()
export class PartnerClient {
  constructor(
    private readonly config: ConfigService,
    private readonly fake: FakePartner,
  ) {}

  @Paced({ name: 'partner-api', capacity: 5, refillPerSecond: 5, maxWaitMs: 3_000 })
  async quote(): Promise<{ quote: number; received: number }> {
    const base = this.config.get<string>('PARTNER_URL') ?? this.fake.url;
    const response = await fetch(`${base}/quote`);
    if (!response.ok) throw new Error(`partner API answered ${response.status}`);
    return (await response.json()) as { quote: number; received: number };
  }
}
