# The swimlane tests read the SVG they write back with libxml2 (a real XML parser, so a
# picture that is not well-formed fails).
if(TARGET test_pipeline)
  meshtrain_require(LibXml2 "libxml2-dev")
  target_link_libraries(test_pipeline PRIVATE LibXml2::LibXml2)
endif()

# Pipeline stages as MPI processes (mpirun -np 2, --pp 2) against the single-rank curve.
if(MESHTRAIN_HAVE_MPI)
  find_program(MESHTRAIN_MPIRUN NAMES mpirun mpiexec)
  foreach(schedule gpipe 1f1b)
    add_test(NAME pipeline_mpi_pp2_${schedule}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/../parallel/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 2
                     --pp 2 --microbatches 4 --schedule ${schedule})
    set_tests_properties(pipeline_mpi_pp2_${schedule} PROPERTIES TIMEOUT 300 LABELS pipeline
        PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  endforeach()
  # ZeRO-2 sharding each stage's parameters over its dp group, across 4 processes.
  add_test(NAME pipeline_mpi_pp2_dp2_zero2
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/../parallel/mpi_parity.sh $<TARGET_FILE:meshtrain> ${MESHTRAIN_MPIRUN} 4
                   --pp 2 --dp 2 --zero 2 --microbatches 2 --schedule 1f1b)
  set_tests_properties(pipeline_mpi_pp2_dp2_zero2 PROPERTIES TIMEOUT 300 LABELS pipeline
      PASS_REGULAR_EXPRESSION "MPI PARITY OK")
  if(TARGET test_pipeline)
    add_dependencies(test_pipeline meshtrain)
  endif()
endif()
