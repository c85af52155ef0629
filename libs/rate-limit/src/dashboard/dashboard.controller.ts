import {
  BadRequestException,
  Body,
  ConflictException,
  Get,
  Header,
  HttpCode,
  Inject,
  type OnModuleInit,
  Post,
  Query,
  Req,
  ServiceUnavailableException,
} from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { RateLimitConfigError, RateLimitError, RateLimitInputError } from '../errors/rate-limit.errors.js';
import { RateLimitHealth } from '../operations/rate-limit-health.js';
import { RateLimitInsights } from '../operations/rate-limit-insights.js';
import { DASHBOARD_CSS } from './assets/dashboard.css.js';
import { DASHBOARD_JS } from './assets/dashboard.js.js';
import { dashboardPage } from './assets/dashboard.html.js';
import { checked, SHAPES } from './dashboard-input.js';
import type { ResolvedDashboardOptions } from './dashboard.options.js';

/** Injection token of a dashboard's resolved options. */
export const DASHBOARD_OPTIONS = Symbol('RATE_LIMIT_DASHBOARD_OPTIONS');

/** How many audit entries the page shows. */
const AUDIT_SHOWN = 50;

/**
 * The page, its two assets and its JSON API. `RateLimitDashboardModule.register()` mounts a subclass of
 * this at its `path` behind its guard; the checks that come before the guard (headers, loopback, writes)
 * are its middleware's. Every answer of the API is computed by `RateLimitInsights` and `RateLimitHealth`;
 * what they refuse as input is answered 400 with their message, and nothing is changed.
 */
export class DashboardController implements OnModuleInit {
  private insights!: RateLimitInsights;
  private health!: RateLimitHealth;

  constructor(
    private readonly moduleRef: ModuleRef,
    @Inject(DASHBOARD_OPTIONS) private readonly options: ResolvedDashboardOptions,
  ) {}

  onModuleInit(): void {
    try {
      this.insights = this.moduleRef.get(RateLimitInsights, { strict: false });
      this.health = this.moduleRef.get(RateLimitHealth, { strict: false });
    } catch {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_MODULE_NOT_IMPORTED',
        'RateLimitDashboardModule needs RateLimitModule, which this application does not import: ' +
          'add RateLimitModule.forRoot({ operations: true }) to the imports of your root module',
      );
    }
  }

  @Get()
  @Header('Content-Type', 'text/html; charset=utf-8')
  page(@Req() request: { originalUrl?: string; url: string }): string {
    // The page's own address, whatever prefix the app mounts it under (a global prefix, a router module).
    const path = (request.originalUrl ?? request.url).split('?')[0].replace(/\/+$/, '');
    return dashboardPage(`${path}/`);
  }

  @Get('assets/app.js')
  @Header('Content-Type', 'text/javascript; charset=utf-8')
  script(): string {
    return DASHBOARD_JS;
  }

  @Get('assets/app.css')
  @Header('Content-Type', 'text/css; charset=utf-8')
  style(): string {
    return DASHBOARD_CSS;
  }

  /** Health, the operator's side on this instance, policies with overrides, blocks, the latest audit. */
  @Get('api/state')
  async state(@Query() query: unknown): Promise<Record<string, unknown>> {
    checked(query, {}, true);
    const health = this.health.status();
    if (!this.insights.enabled) return { now: Date.now(), health, operations: { enabled: false } };
    const [policies, overrides, blocks, audit] = await this.answer(() =>
      Promise.all([this.insights.policies(), this.insights.overrides(), this.insights.blocks(), this.insights.audit(AUDIT_SHOWN)]),
    );
    return { now: Date.now(), health, operations: this.insights.status(), policies, overrides, blocks, audit };
  }

  @Get('api/series')
  series(@Query() query: unknown): Promise<unknown> {
    const { scope, seconds } = checked(query, SHAPES.series, true);
    return this.answer(() => this.insights.series(scope as string, seconds === undefined ? {} : { seconds: seconds as number }));
  }

  @Get('api/top')
  top(@Query() query: unknown): Promise<unknown> {
    const { scope, by, window } = checked(query, SHAPES.top, true);
    const options = { by: (by ?? 'refused') as 'refused' | 'allowed', windowSeconds: (window ?? 300) as number };
    return this.answer(() => this.insights.top(scope as string, options));
  }

  @Get('api/identity')
  identity(@Query() query: unknown): Promise<unknown> {
    const { scope, identity } = checked(query, SHAPES.identity, true);
    return this.answer(() => this.insights.inspect(scope as string, identity as string));
  }

  @Post('api/block')
  @HttpCode(200)
  block(@Body() body: unknown, @Req() request: unknown): Promise<unknown> {
    const { target, seconds, reason } = checked(body, SHAPES.block);
    const by = this.operator(request);
    return this.answer(() => this.insights.block({ target: target as string, seconds: seconds as number, reason: reason as string, by }));
  }

  @Post('api/unblock')
  @HttpCode(200)
  async unblock(@Body() body: unknown, @Req() request: unknown): Promise<{ removed: boolean }> {
    const { target, reason } = checked(body, SHAPES.unblock);
    const change = this.change(request, reason);
    return { removed: await this.answer(() => this.insights.unblock(target as string, change)) };
  }

  @Post('api/override')
  @HttpCode(200)
  override(@Body() body: unknown, @Req() request: unknown): Promise<unknown> {
    const fields = checked(body, SHAPES.override);
    const by = this.operator(request);
    return this.answer(() => this.insights.setOverride({ ...fields, by } as Parameters<RateLimitInsights['setOverride']>[0]));
  }

  @Post('api/override/clear')
  @HttpCode(200)
  async clearOverride(@Body() body: unknown, @Req() request: unknown): Promise<{ removed: boolean }> {
    const { scope, identity, reason } = checked(body, SHAPES.clearOverride);
    const change = this.change(request, reason);
    return { removed: await this.answer(() => this.insights.clearOverride(scope as string, identity as string | undefined, change)) };
  }

  @Post('api/reset')
  @HttpCode(200)
  async reset(@Body() body: unknown, @Req() request: unknown): Promise<{ reset: true }> {
    const { scope, identity, reason } = checked(body, SHAPES.reset);
    const change = this.change(request, reason);
    await this.answer(() => this.insights.reset(scope as string, identity as string, change));
    return { reset: true };
  }

  /** The operator as the app's auth knows them, at most 100 characters: never from the body. */
  private operator(request: unknown): string {
    const who = String(this.options.operator(request) ?? '').trim();
    return (who === '' ? 'unknown' : who).slice(0, 100);
  }

  private change(request: unknown, reason: string | number | boolean | undefined): { by: string; reason?: string } {
    const by = this.operator(request);
    return reason === undefined ? { by } : { by, reason: reason as string };
  }

  /** Runs a call of the API: its input errors are 400s, operations off a 409, a store that fails a 503. */
  private async answer<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (error instanceof RateLimitInputError) throw new BadRequestException(error.message);
      if (error instanceof RateLimitConfigError && error.code === 'ERR_RATE_LIMIT_OPERATIONS_OFF')
        throw new ConflictException(error.reason);
      if (error instanceof RateLimitError || (error instanceof Error && /redis|connect|ECONN|timed? ?out/i.test(error.message))) {
        throw new ServiceUnavailableException(`the store did not answer: ${error.message}`);
      }
      throw error;
    }
  }
}
