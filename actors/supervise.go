package actors

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/actor"
)

// props makes the props of one of the system's actors. A panic inside
// Receive would have protoactor restart the actor with fresh state and the
// message lost, leaving futures that never complete; instead it fails the
// whole load, so everything waiting gets the cause.
func (s *System) props(producer func() actor.Actor) *actor.Props {
	return actor.PropsFromProducer(producer, actor.WithReceiverMiddleware(func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			defer func() {
				if r := recover(); r != nil {
					err := fmt.Errorf("internal error in %T handling %T: %v", c.Actor(), env.Message, r)
					slog.Error("actors: panic", "err", err, "stack", string(debug.Stack()))
					s.failAll(err)
				}
			}()
			next(c, env)
		}
	}))
}
