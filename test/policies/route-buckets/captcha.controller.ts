// The README's "Route buckets by identity" snippet, as written there.
import { BadRequestException, Body, Controller, Ip, Post } from '@nestjs/common';
import { BucketService, RateLimit } from 'nest-redis-rate-limit';

@Controller('auth')
export class AuthController {
  constructor(private readonly buckets: BucketService) {}

  @Post('login')
  @RateLimit({ name: 'login', capacity: 5, refillPerSecond: 1 / 60 }) // 5 attempts per IP, then one a minute
  login() {
    return { ok: true };
  }

  @Post('captcha')
  async captcha(@Ip() ip: string, @Body('answer') answer: string) {
    if (answer !== 'expected') throw new BadRequestException('wrong answer'); // your captcha check
    await this.buckets.resetRoute('login', { ip }); // 5 attempts again
    return this.buckets.peekRoute('login', { ip }); // { allowed: true, limit: 5, remaining: 5, ... }
  }
}
