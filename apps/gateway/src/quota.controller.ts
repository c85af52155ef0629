import { Controller, Get, Headers, Param, ParseIntPipe, Post } from '@nestjs/common';
import { BucketService } from 'nest-redis-rate-limit';

const EXPORTS = { capacity: 3, refillPerSecond: 1 / 600 };

/** BucketService used directly: a named bucket per account, outside any route policy. */
@Controller('accounts/:id/exports')
export class QuotaController {
  constructor(private readonly buckets: BucketService) {}

  @Get()
  remaining(@Param('id', ParseIntPipe) id: number) {
    return this.buckets.peek(`account:${id}:exports`, EXPORTS);
  }

  @Post()
  async start(@Param('id', ParseIntPipe) id: number, @Headers('x-request-id') requestId?: string) {
    const decision = await this.buckets.consume(`account:${id}:exports`, EXPORTS);
    return decision.allowed
      ? { started: true, requestId: requestId ?? null, remaining: decision.remaining }
      : { started: false, retryAfterSeconds: decision.retryAfterSeconds };
  }
}
