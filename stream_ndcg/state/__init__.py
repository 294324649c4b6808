"""Where the state lives: the store protocol (`base`), its in-memory twin (`memory`), the Redis
store (`redis`, with its reads in `redis_reads` and its key layout and scripts in
`redis_scripts`), the stored format (`format`) and the writer's cache (`cache`)."""
