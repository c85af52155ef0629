import { jest } from '@jest/globals';
import { type INestApplication, Logger, Module, type Provider, type Type } from '@nestjs/common';
import { APP_GUARD, ModuleRef } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { lastValueFrom, of } from 'rxjs';
import request from 'supertest';
import { RateLimitGuard, RateLimitInterceptor, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { RouteLimiter } from '../../../libs/rate-limit/src/pipeline/route-limiter.js';
import { PolicyRegistry } from '../../../libs/rate-limit/src/policies/policy-registry.js';
import { createApp } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { NoGuardController, PathController } from './request-path.controllers.js';

/**
 * What a request's path does besides deciding it. A set-up warning is built on a route's first call that
 * has it to say, and then only marked on the route's plan: the calls after it build none (no key, no
 * message, no look-up in the said set). The route's plan is looked up once per request, by the guard;
 * the interceptor takes it from the guard's state. Memory store: nothing here is about Redis.
 */
describe('the request path', () => {
  const recorder = new LogRecorder();
  let app: INestApplication | undefined;

  async function start(options: RateLimitModuleOptions, controllers: Type[], providers: Provider[] = []) {
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', ...options })], controllers, providers })
    class RequestPathModule {}
    app = await createApp(RequestPathModule, 'express');
    Logger.overrideLogger(recorder);
    recorder.clear();
    return app;
  }
  /** Calls of `SetupWarnings.once`: every warning is built and looked up in the said set there. */
  const watchWarnings = () => jest.spyOn(app!.get(RouteLimiter).warnings, 'once');
  const warned = (start: string) => recorder.of('RateLimit', 'warn').filter((line) => line.startsWith(start));
  const get = (path: string) => request(app!.getHttpServer()).get(path).expect(200);
  /** A call of a transport other than HTTP, of the handler `PathController.ip`, as Nest's context for it. */
  const callOf = (type: string, args: unknown[]) => {
    const context = new ExecutionContextHost(args, PathController, PathController.prototype.ip);
    context.setType(type);
    return context;
  };

  afterEach(async () => {
    Logger.overrideLogger(false);
    await app?.close();
    app = undefined;
  });

  it('two rate-limit guards on a route: said at its first request, and not built again', async () => {
    await start({}, [PathController], [{ provide: APP_GUARD, useClass: RateLimitGuard }]);
    const once = watchWarnings();
    await get('/path/ip');
    const said = 'Two rate-limit guards run on PathController.ip (RateLimitGuard, then RateLimitGuard): only the first decides.';
    expect(warned(said)).toHaveLength(1);
    once.mockClear();
    for (let i = 0; i < 5; i++) await get('/path/ip');
    expect(once).not.toHaveBeenCalled();
    expect(warned('Two rate-limit guards')).toHaveLength(1);
  });

  it('no RateLimitGuard (guard: false): said at the route’s first request, and not built again', async () => {
    await start({ guard: false }, [NoGuardController]);
    const once = watchWarnings();
    await get('/no-guard');
    expect(warned('No RateLimitGuard ran before NoGuardController.get (guard: false?)')).toHaveLength(1);
    once.mockClear();
    for (let i = 0; i < 5; i++) await get('/no-guard');
    expect(once).not.toHaveBeenCalled();
    expect(warned('No RateLimitGuard ran')).toHaveLength(1);
  });

  it('a handler called by a transport the limiter does not decide: said at its first call, by the guard or the interceptor, and not built again', async () => {
    await start({}, [PathController]);
    const guard = app!.get(RateLimitGuard);
    const interceptor = new RateLimitInterceptor(app!.get(ModuleRef));
    const once = watchWarnings();
    const call = async () => {
      const context = callOf('kafka', [{ value: 'a message' }]);
      expect(guard.canActivate(context)).toBe(true);
      expect(await lastValueFrom(await interceptor.intercept(context, { handle: () => of('handled') }))).toBe('handled');
    };
    await call();
    expect(
      warned("@RateLimit on PathController.ip (a 'kafka' handler) is not enforced: nest-redis-rate-limit limits HTTP routes"),
    ).toHaveLength(1);
    once.mockClear();
    for (let i = 0; i < 5; i++) await call();
    expect(once).not.toHaveBeenCalled();
    expect(warned('@RateLimit on PathController.ip')).toHaveLength(1);
  });

  it('a GraphQL context with the request and no response: said at the first call, and not built again', async () => {
    await start({}, [PathController]);
    const guard = app!.get(RateLimitGuard);
    const once = watchWarnings();
    // [root, args, GraphQL context, info]: a Fastify request (it has `raw`) and no reply beside it.
    const call = async () =>
      expect(await guard.canActivate(callOf('graphql', [{}, {}, { req: { raw: {}, ip: '203.0.113.5', headers: {} } }, {}]))).toBe(true);
    await call();
    expect(warned('The GraphQL context of PathController.ip has the request but no response')).toHaveLength(1);
    once.mockClear();
    for (let i = 0; i < 5; i++) await call();
    expect(once).not.toHaveBeenCalled();
    expect(warned('The GraphQL context of')).toHaveLength(1);
  });

  it('looks the route’s plan up once per request when the guard and the interceptor both decide', async () => {
    await start({}, [PathController]);
    const planFor = jest.spyOn(app!.get(PolicyRegistry), 'planFor');
    for (let i = 0; i < 4; i++) {
      const response = await get('/path/both');
      // Both phases decided: the headers describe the interceptor's verdict over both policies.
      expect(response.headers['x-ratelimit-remaining']).toBe(String(999 - i));
    }
    expect(planFor).toHaveBeenCalledTimes(4);
  });
});
