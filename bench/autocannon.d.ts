/** The part of autocannon's programmatic API the benchmark uses (the package ships no types). */
declare module 'autocannon' {
  interface Options {
    url: string;
    connections?: number;
    duration?: number;
    pipelining?: number;
    /** The requests each connection sends in turn; `setupRequest` is called for every request sent. */
    requests?: RequestOptions[];
  }
  interface RequestOptions {
    method?: string;
    path?: string;
    headers?: Record<string, string>;
    setupRequest?: (request: RequestOptions & { headers: Record<string, string> }) => RequestOptions;
  }
  interface Histogram {
    average: number;
    p50: number;
    p99: number;
    total: number;
  }
  interface Result {
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    '2xx': number;
    latency: Histogram;
    requests: Histogram;
  }
  /** The running job: a promise of the result that also emits one 'response' per answer. */
  interface Instance extends PromiseLike<Result> {
    /** `responseTime`: ms with sub-ms resolution (the result's histogram keeps whole ms only). */
    on(event: 'response', listener: (client: unknown, statusCode: number, bytes: number, responseTime: number) => void): this;
  }
  function autocannon(options: Options): Instance;
  export default autocannon;
}
