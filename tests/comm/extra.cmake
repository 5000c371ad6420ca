# MPI tests of the comm layer: tests/comm/mpi/mpi_runner.cpp is started by mpirun with 1 to 8
# processes (more ranks than cores: --oversubscribe), checking every operation against the serial
# reference, and the fault modes (a process that exits, throws, or never calls) that must end
# with a named CommError. The regexes check what failed and why, not how fast: on a loaded
# machine mpirun's start-up alone can take seconds, so the 60 s TIMEOUT is only a hang guard.
if(MESHTRAIN_HAVE_MPI)
  add_executable(test_comm_mpi_runner ${CMAKE_CURRENT_LIST_DIR}/mpi/mpi_runner.cpp)
  target_compile_options(test_comm_mpi_runner PRIVATE ${MESHTRAIN_WARNINGS})
  target_link_libraries(test_comm_mpi_runner PRIVATE meshtrain_core)
  find_program(MESHTRAIN_MPIRUN NAMES mpirun mpiexec)
  set(_mpirun ${MESHTRAIN_MPIRUN} --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none)
  foreach(np 1 2 3 4 5 6 7 8)
    add_test(NAME comm_mpi_checks_np${np} COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:test_comm_mpi_runner> checks)
    set_tests_properties(comm_mpi_checks_np${np} PROPERTIES TIMEOUT 600 LABELS comm
        PASS_REGULAR_EXPRESSION "RESULT rank=0 checks passed")
  endforeach()
  # hier sliced over the shared window of each (emulated) host's ranks: 2 and 3 hosts of 2.
  foreach(np 4 6)
    add_test(NAME comm_mpi_hier_np${np} COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:test_comm_mpi_runner> hier)
    set_tests_properties(comm_mpi_hier_np${np} PROPERTIES TIMEOUT 600 LABELS comm
        PASS_REGULAR_EXPRESSION "RESULT rank=0 hier sliced equals unsliced")
  endforeach()
  foreach(np 2 3)
    math(EXPR last "${np} - 1")
    add_test(NAME comm_mpi_fault_exit_np${np} COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:test_comm_mpi_runner> exit)
    add_test(NAME comm_mpi_fault_throw_np${np} COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:test_comm_mpi_runner> throw)
    add_test(NAME comm_mpi_fault_never_np${np} COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:test_comm_mpi_runner> never)
    # The job must end (TIMEOUT: a hang guard far above the 2 s deadline) with a named error.
    # A process that exits: by default mpirun then terminates the others, whose SIGTERM handler
    # names the operation they were blocked in (a survivor, not necessarily rank 0: on a loaded
    # machine the launcher can kill rank 0 before it reaches the operation, which it then
    # cannot name); with orte_abort_on_non_zero_status 0 the others hit their own deadline and
    # report the CommError; the first deadline to fire may be rank 0's neighbour's, so rank 0
    # names the rank it was waiting for either way (its own timeout, or a peer's notice).
    set_tests_properties(comm_mpi_fault_exit_np${np} PROPERTIES TIMEOUT 60 LABELS comm
        PASS_REGULAR_EXPRESSION "world rank [0-9]+ terminated by the launcher while waiting in all_reduce #1 on group 'world'")
    add_test(NAME comm_mpi_fault_exit_deadline_np${np}
             COMMAND ${_mpirun} --mca orte_abort_on_non_zero_status 0 -np ${np} $<TARGET_FILE:test_comm_mpi_runner> exit)
    set_tests_properties(comm_mpi_fault_exit_deadline_np${np} PROPERTIES TIMEOUT 60 LABELS comm
        PASS_REGULAR_EXPRESSION "RESULT rank=0 failed after [0-9]+\\.[0-9]+ s: all_reduce #1 on group 'world'.*waiting for rank ${last}")
    # A thrower: rank 1 leaves all_reduce #0 and throws; rank 0 hears of it in #1, or still in #0
    # when its own part of the ring ended after rank 1's (seen on a loaded machine).
    set_tests_properties(comm_mpi_fault_throw_np${np} PROPERTIES TIMEOUT 60 LABELS comm
        PASS_REGULAR_EXPRESSION "RESULT rank=0 failed after [0-9]+\\.[0-9]+ s: all_reduce #[01] on group 'world'.*boom in rank 1")
    set_tests_properties(comm_mpi_fault_never_np${np} PROPERTIES TIMEOUT 60 LABELS comm
        PASS_REGULAR_EXPRESSION "RESULT rank=0 failed after [0-9]+\\.[0-9]+ s: all_reduce #1 on group 'world'.*ranks not heard from")
  endforeach()
endif()
