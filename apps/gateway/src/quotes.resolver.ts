import { Args, Int, Mutation, Query, Resolver } from '@nestjs/graphql';
import { RateLimit } from 'nest-redis-rate-limit';

/** The demo's GraphQL schema (schema first): one query and one mutation, each limited like a route. */
export const QUOTES_SCHEMA = `
  type Query {
    "5, then one a second, per IP"
    quote: String!
  }
  type Mutation {
    "Likes a quote; costs 2 of the same per-IP bucket of 10 (one like a second)"
    like(id: Int!): Int!
  }
`;

const QUOTES = ['Make it loud or make it right.', 'One round trip, no background jobs.', 'Exact under concurrency.'];

/**
 * Try: `curl -s localhost:3000/graphql -H 'content-type: application/json' -d '{"query":"{ quote }"}'`
 * six times in a row — the sixth answers HTTP 200 with `errors[0].extensions: { code: 'RATE_LIMITED',
 * retryAfter: 1 }` and the rate-limit headers.
 */
@Resolver()
export class QuotesResolver {
  private readonly likes = new Map<number, number>();

  @Query('quote')
  @RateLimit(5, 1)
  quote(): string {
    return QUOTES[Math.floor(Math.random() * QUOTES.length)];
  }

  @Mutation('like')
  @RateLimit({ capacity: 10, refillPerSecond: 1, cost: 2, name: 'likes' })
  like(@Args('id', { type: () => Int }) id: number): number {
    const count = (this.likes.get(id) ?? 0) + 1;
    this.likes.set(id, count);
    return count;
  }
}
