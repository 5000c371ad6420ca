# Two hosts simulated as network namespaces joined by their links to a bridge, mpirun across them
# (tests/hosts/netns.sh). two_hosts.sh: --dp 2 and --pp 2 with one rank per host reproduce the
# threads run. host_fault.sh: a partition (the link taken down) and a stopped rank (SIGSTOP) end
# the whole job with meshtrain's error within the deadline plus seconds, and --resume continues
# on the uninterrupted curve. Needs root and iproute2; skipped where namespaces cannot be made.
if(MESHTRAIN_HAVE_MPI)
  find_program(MESHTRAIN_MPIRUN NAMES mpirun mpiexec)
  foreach(layout dp pp)
    add_test(NAME hosts_two_namespaces_${layout}2
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/two_hosts.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN}
                     --${layout} 2 --microbatches 2)
    set_tests_properties(hosts_two_namespaces_${layout}2 PROPERTIES TIMEOUT 400 LABELS hosts
        PASS_REGULAR_EXPRESSION "TWO HOSTS OK" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
  endforeach()
  foreach(fault partition sigstop)
    add_test(NAME hosts_fault_${fault}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/host_fault.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} ${fault})
    set_tests_properties(hosts_fault_${fault} PROPERTIES TIMEOUT 400 LABELS hosts
        PASS_REGULAR_EXPRESSION "HOST FAULT OK" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
  endforeach()
endif()
# launch_hosts.sh: `meshtrain launch --hosts --grow` across the two hosts; host b's link cut
# mid-run, the job goes on on host a within the deadline plus the restart, and when the link
# is back the job grows to both hosts again, every step on the single-rank curve.
if(MESHTRAIN_HAVE_MPI)
  add_test(NAME hosts_launch_cut_and_grow
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/launch_hosts.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN})
  set_tests_properties(hosts_launch_cut_and_grow PROPERTIES TIMEOUT 400 LABELS hosts
      PASS_REGULAR_EXPRESSION "LAUNCH HOSTS OK" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
# soak.sh, short: 100 s with a fault every 30 s (kill, stop, cut in turn), then the replay
# without faults that must agree with the run to the bit. On two hosts the layout changes with
# each lost host (dp 1, then dp 2 again with --grow); on three with --max-ranks 2 the spare
# host keeps it at dp 2, and the final loss must equal an uninterrupted run's exactly. The
# 30-minute soaks are the same script with 1830 150 (docs/benchmarks.md, "Elastic training").
if(MESHTRAIN_HAVE_MPI)
  foreach(hosts 2 3)
    set(name hosts_launch_soak_short)
    if(hosts EQUAL 3)
      set(name hosts_launch_soak_spare_short)
    endif()
    add_test(NAME ${name}
             COMMAND ${CMAKE_COMMAND} -E env SOAK_REF=0 SOAK_HOSTS=${hosts}
                     ${CMAKE_CURRENT_LIST_DIR}/soak.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 100 30)
    set_tests_properties(${name} PROPERTIES TIMEOUT 900 LABELS hosts
        PASS_REGULAR_EXPRESSION "SOAK OK" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
  endforeach()
endif()
# hier_hosts.sh: two ranks on each of the two hosts, --allreduce hier under mpirun equals the
# threads run on emulated hosts bit for bit, and auto picks hier there.
if(MESHTRAIN_HAVE_MPI)
  add_test(NAME hosts_hier_two_by_two
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/hier_hosts.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN})
  set_tests_properties(hosts_hier_two_by_two PROPERTIES TIMEOUT 400 LABELS hosts
      PASS_REGULAR_EXPRESSION "HIER HOSTS OK" SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
