import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Burst 10, refilled at one token per 2 s: no refill worth a token during one scenario's phases. */
export const CAPACITY = 10;
export const REFILL_PER_SECOND = 0.5;
export const SCOPE = 'FailureController.limited';
export const BULK_CAPACITY = 200;

/** One route, one bucket per API key: each phase of a scenario uses a key of its own. */
@Controller('limited')
export class FailureController {
  @Get()
  @RateLimit({ capacity: CAPACITY, refillPerSecond: REFILL_PER_SECOND, keyBy: 'apiKey' })
  limited() {
    return { ok: true };
  }

  /** One token, refilled after 100 s: a second request is denied, and stays denied for the test. */
  @Get('once')
  @RateLimit({ capacity: 1, refillPerSecond: 0.01, keyBy: 'apiKey' })
  once() {
    return { ok: true };
  }

  /** 200 tokens that do not refill within a test: counts stay exact under any load. */
  @Get('bulk')
  @RateLimit({ capacity: BULK_CAPACITY, refillPerSecond: 0.001, keyBy: 'apiKey' })
  bulk() {
    return { ok: true };
  }
}

/**
 * No policy: the control route. A request to it takes everything a limited request does (HTTP, the
 * guard finding no policy, the handler, the client) except a decision.
 */
@Controller('control')
export class ControlController {
  @Get()
  control() {
    return { ok: true };
  }
}
