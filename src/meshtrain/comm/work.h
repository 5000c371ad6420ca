// Work: the handle of an asynchronous operation (c10d style). wait() blocks until the operation
// finished and rethrows its CommError; is_completed() never blocks; error() peeks at a failure.
//
// Contract: a Work may be waited on from any thread, any number of times; dropping a Work does
// not cancel a collective (it still runs, in issue order), but the buffers it uses must stay
// alive until it completes. A default-constructed Work is complete.
#pragma once

#include <exception>
#include <memory>

#include "meshtrain/comm/types.h"

namespace meshtrain::comm {

// ---- WorkImpl ----
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;             // never blocks
  virtual void wait(Timeout t) = 0;    // throws CommError
  virtual std::exception_ptr error() = 0;
};

// ---- Work ----
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkImpl> impl) : impl_(std::move(impl)) {}
  // Blocks until done and rethrows the operation's error. t > 0 bounds the wait: if the
  // operation has not finished by then, throws a timeout CommError (the operation itself still
  // ends by its own deadline). t == 0 waits for the operation, which cannot outlive its deadline.
  void wait(Timeout t = Timeout{0}) {
    if (impl_) impl_->wait(t);
  }
  bool is_completed() const { return !impl_ || impl_->test(); }
  std::exception_ptr error() const { return impl_ ? impl_->error() : nullptr; }

 private:
  std::shared_ptr<WorkImpl> impl_;
};

}  // namespace meshtrain::comm
